//! A batch's cache taken apart into rows and put together again, or a row put into a
//! free row of a running batch's cache, so that rows can join and leave a running batch
//! ([`crate::engine`]). A row keeps only its real tokens' keys and
//! values (token history included), in order, and its own carried state (QKV-conv state). Put
//! together, each row's tokens start at column 0 and the rest of its row is padding (mask 0,
//! zeros): the right-padded layout a batched prefill leaves, which both attention variants
//! are exact for (`tests/tests/batch.rs`).

use crate::session::{Cache, NeedleSession};
use anyhow::{bail, Result};
use graphs::contract::AttentionKind;
use ort::memory::AllocationDevice;
use ort::value::{DynTensorValueType, DynValue, TensorElementType};

/// One row of a cache: `len` real tokens.
pub struct RowCache {
    /// Per layer its key, then its value: `[num_kv_heads, len, width]`, raw elements.
    kv: Vec<Vec<u8>>,
    /// The row of each carried state tensor (see [`Cache::states`]), raw elements.
    states: Vec<Vec<u8>>,
    len: usize,
}

impl RowCache {
    /// Tokens the row has seen.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The cache columns that hold row `mask`'s real keys. GroupQueryAttention keeps a row's
/// keys packed from slot 0 (only the count of real columns matters); the reference graph
/// writes each step's keys at the step's columns, so a row that joined a wider batch has
/// padding columns between its tokens.
pub fn real_columns(attention: AttentionKind, mask: &[i64]) -> Vec<usize> {
    match attention {
        AttentionKind::Fused(_) => (0..mask.iter().filter(|&&m| m == 1).count()).collect(),
        AttentionKind::Reference => (0..mask.len()).filter(|&c| mask[c] == 1).collect(),
    }
}

impl NeedleSession {
    /// The rows of `cache` whose attention-mask rows are `masks` (one per cache row, as wide
    /// as the cache), for the rows `keep` names, in that order.
    pub fn split_rows(
        &self,
        cache: &Cache,
        masks: &[&[i64]],
        keep: &[usize],
    ) -> Result<Vec<RowCache>> {
        let attention = self.description.variant.attention;
        let kv = cache
            .key_values()
            .map(host_bytes)
            .collect::<Result<Vec<_>>>()?;
        let states = cache.states().map(host_bytes).collect::<Result<Vec<_>>>()?;
        keep.iter()
            .map(|&r| {
                let columns = real_columns(attention, masks[r]);
                let kv = kv
                    .iter()
                    .map(|t| {
                        let [batch, heads, positions, width] = t.shape[..] else {
                            bail!("a key/value tensor of shape {:?}", t.shape);
                        };
                        if r >= batch || columns.last().is_some_and(|&c| c >= positions) {
                            bail!(
                                "row {r} with {} real columns does not fit {:?}",
                                columns.len(),
                                t.shape
                            );
                        }
                        let item = width * t.element;
                        let mut row = Vec::with_capacity(heads * columns.len() * item);
                        for h in 0..heads {
                            let head = (r * heads + h) * positions;
                            for &c in &columns {
                                let at = (head + c) * item;
                                row.extend_from_slice(&t.bytes[at..at + item]);
                            }
                        }
                        Ok(row)
                    })
                    .collect::<Result<_>>()?;
                let states = states
                    .iter()
                    .map(|t| {
                        let per_row = t.bytes.len() / t.shape[0].max(1);
                        t.bytes[r * per_row..(r + 1) * per_row].to_vec()
                    })
                    .collect();
                Ok(RowCache {
                    kv,
                    states,
                    len: columns.len(),
                })
            })
            .collect()
    }

    /// One cache of `rows` in the right-padded layout, as wide as the longest row, with room
    /// for `capacity` tokens where the plan updates the cache in place. Returns it with each
    /// row's attention-mask row.
    pub fn join_rows(&self, rows: &[RowCache], capacity: usize) -> Result<(Cache, Vec<Vec<i64>>)> {
        let width = rows.iter().map(RowCache::len).max().unwrap_or(0);
        let positions = match self.plan.in_place_cache {
            true => capacity.max(width).min(self.config().max_seq_len()),
            false => width,
        };
        let mut cache = self.zeroed_cache(rows.len(), positions, width)?;
        let masks = rows
            .iter()
            .enumerate()
            .map(|(slot, row)| self.put_row(&mut cache, slot, row))
            .collect::<Result<_>>()?;
        Ok((cache, masks))
    }

    /// Writes `row` into row `slot` of `cache`, its tokens from column 0 (what was there
    /// after them stays, as padding); the other rows are left as they are. Returns the
    /// slot's attention-mask row, as wide as the cache.
    pub fn put_row(&self, cache: &mut Cache, slot: usize, row: &RowCache) -> Result<Vec<i64>> {
        let width = cache.len();
        if row.len > width {
            bail!(
                "a row of {} tokens does not fit a cache of {width} columns",
                row.len
            );
        }
        for (index, tensor) in cache.key_values_mut().enumerate() {
            let t = host_bytes_mut(tensor)?;
            let [batch, heads, positions, item] = t.shape[..] else {
                bail!("a key/value tensor of shape {:?}", t.shape);
            };
            if slot >= batch {
                bail!("row {slot} of a batch of {batch}");
            }
            let item = item * t.element;
            let run = row.len * item;
            for h in 0..heads {
                let at = (slot * heads + h) * positions * item;
                t.bytes[at..at + run].copy_from_slice(&row.kv[index][h * run..(h + 1) * run]);
            }
        }
        for (index, tensor) in cache.states_mut().enumerate() {
            let t = host_bytes_mut(tensor)?;
            let per_row = t.bytes.len() / t.shape[0].max(1);
            t.bytes[slot * per_row..(slot + 1) * per_row].copy_from_slice(&row.states[index]);
        }
        Ok((0..width).map(|c| i64::from(c < row.len)).collect())
    }
}

/// Sets every element of a host tensor to zero.
pub(crate) fn zero(value: &mut DynValue) -> Result<()> {
    host_bytes_mut(value)?.bytes.fill(0);
    Ok(())
}

/// A tensor's elements as bytes, its shape and element size.
struct HostBytes<B> {
    bytes: B,
    shape: Vec<usize>,
    element: usize,
}

fn element_size(ty: TensorElementType) -> Result<usize> {
    Ok(match ty {
        TensorElementType::Float32 => 4,
        TensorElementType::Float16 => 2,
        TensorElementType::Int64 => 8,
        other => bail!("a cache tensor of {other:?}"),
    })
}

fn host_bytes(value: &DynValue) -> Result<HostBytes<&[u8]>> {
    let tensor = value.view().downcast::<DynTensorValueType>()?;
    if tensor.memory_info().allocation_device() != AllocationDevice::CPU {
        bail!("the cache is not in host memory, so rows cannot join or leave the batch");
    }
    let shape: Vec<usize> = tensor.shape().iter().map(|&d| d as usize).collect();
    let element = element_size(*tensor.data_type())?;
    let len = shape.iter().product::<usize>() * element;
    let data = tensor.data_ptr().cast::<u8>();
    // SAFETY: a host tensor of `len` bytes, which `value` owns and keeps alive for as long
    // as the borrow this returns.
    let bytes = match len {
        0 => &[][..],
        _ => unsafe { std::slice::from_raw_parts(data, len) },
    };
    Ok(HostBytes {
        bytes,
        shape,
        element,
    })
}

fn host_bytes_mut(value: &mut DynValue) -> Result<HostBytes<&mut [u8]>> {
    let HostBytes {
        bytes,
        shape,
        element,
    } = host_bytes(value)?;
    let (data, len) = (bytes.as_ptr().cast_mut(), bytes.len());
    // SAFETY: as in `host_bytes` (onnxruntime hands out the tensor's data as mutable),
    // borrowed mutably from `value`.
    let bytes = match len {
        0 => &mut [][..],
        _ => unsafe { std::slice::from_raw_parts_mut(data, len) },
    };
    Ok(HostBytes {
        bytes,
        shape,
        element,
    })
}
