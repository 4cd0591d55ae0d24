//! A batch's cache taken apart into rows and put together again, or a row put into a
//! free row of a running batch's cache, so that rows can join and leave a running batch
//! ([`crate::engine`]). A row keeps only its real tokens' keys and values (token history
//! included), in order, and its own carried state (QKV-conv state). Put together, each
//! row's tokens start at column 0 and the rest of its row is padding (mask 0, zeros): the
//! right-padded layout a batched prefill leaves, which both attention variants are exact
//! for (`tests/tests/padded_batch.rs`).

use super::host::{host_bytes, host_bytes_mut};
use super::Cache;
use anyhow::{bail, Result};
use graphs::contract::AttentionKind;

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

    /// A row of `len` tokens with no tensors, for tests of what holds rows.
    #[cfg(test)]
    pub(crate) fn empty_of_len(len: usize) -> RowCache {
        RowCache {
            kv: Vec::new(),
            states: Vec::new(),
            len,
        }
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

/// The attention-mask row of a row of `len` tokens in a cache `width` columns wide, in the
/// right-padded layout: its tokens first, then padding.
pub fn padded_mask(len: usize, width: usize) -> Vec<i64> {
    (0..width).map(|c| i64::from(c < len)).collect()
}

/// The rows of `cache` (written by a graph of `attention`) whose attention-mask rows are
/// `masks` (one per cache row, as wide as the cache), for the rows `keep` names, in that
/// order.
pub fn split(
    cache: &Cache,
    attention: AttentionKind,
    masks: &[&[i64]],
    keep: &[usize],
) -> Result<Vec<RowCache>> {
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

/// The longest of `rows`: the width of the cache [`join`] puts them in.
pub fn width(rows: &[RowCache]) -> usize {
    rows.iter().map(RowCache::len).max().unwrap_or(0)
}

/// `rows` in the right-padded layout, written into `zeroed` (a cache of zeros with a row
/// for each and as wide as [`width`], as `NeedleSession::zeroed_cache` makes). Returns
/// it with each row's attention-mask row.
pub fn join(mut zeroed: Cache, rows: &[RowCache]) -> Result<(Cache, Vec<Vec<i64>>)> {
    let masks = rows
        .iter()
        .enumerate()
        .map(|(slot, row)| put(&mut zeroed, slot, row))
        .collect::<Result<_>>()?;
    Ok((zeroed, masks))
}

/// Writes `row` into row `slot` of `cache`, its tokens from column 0 (what was there after
/// them stays, as padding); the other rows are left as they are. Returns the slot's
/// attention-mask row, as wide as the cache.
pub fn put(cache: &mut Cache, slot: usize, row: &RowCache) -> Result<Vec<i64>> {
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
    Ok(padded_mask(row.len, width))
}
