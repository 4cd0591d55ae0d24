//! The accelerator graphs' cache (`needle-export --target`): every layer's keys and values
//! in buffers of the graphs' fixed capacity, slot `p` holding position `p` (or, for a
//! ring, slot `p mod capacity`), which each call's `new_key_values.*` are written into at
//! the call's slots (in place: a step copies only its own tokens' keys and values); the
//! mask over the slots and a ring's slot positions; Needle 3's QKV-conv state; and the
//! row's last tokens, which the graphs read as `token_window`.

use super::host::host_bytes_mut;
use super::Cache;
use anyhow::{bail, Result};
use ort::value::DynValue;

/// What the caller of the accelerator graphs keeps besides the keys, values and conv state.
pub struct FixedSlots {
    /// float32 `[1, capacity]`: 1 for the slots that hold the row's tokens.
    pub(crate) mask: DynValue,
    /// A ring's int32 `[1, capacity]`: the position each slot holds; `None` when slot `p`
    /// holds position `p`.
    pub(crate) positions: Option<DynValue>,
    /// The row's last `history` tokens (fewer before it has seen that many), oldest first.
    pub(crate) recent: Vec<i32>,
    /// Tokens before a call that the graphs read (`engram_history`).
    pub(crate) history: usize,
}

impl FixedSlots {
    /// `token_window` of a call of `tokens` taking `sequence` tokens: the `history` tokens
    /// before it (0 where the row has none), then `tokens`, then 0 up to `sequence`.
    pub(crate) fn token_window(&self, tokens: &[i64], sequence: usize) -> Vec<i32> {
        let mut window = vec![0; self.history - self.recent.len()];
        window.extend_from_slice(&self.recent);
        window.extend(tokens.iter().map(|&t| t as i32));
        window.resize(self.history + sequence, 0);
        window
    }
}

/// `count` of a call's tokens from its token `token` on, which go to slots `slot …`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRun {
    pub token: usize,
    pub slot: usize,
    pub count: usize,
}

/// Where a call of `n` tokens at positions `p0 …` goes in a cache of `capacity` slots:
/// slots `p0 … p0 + n − 1`; in a ring, position `p` to slot `p mod capacity`, in at most
/// two runs, and only the last `capacity` tokens (the earlier ones' slots are theirs).
pub(crate) fn slot_runs(p0: usize, n: usize, capacity: usize, ring: bool) -> Vec<SlotRun> {
    if !ring {
        return vec![SlotRun {
            token: 0,
            slot: p0,
            count: n,
        }];
    }
    let kept = n.min(capacity);
    let token = n - kept;
    let slot = (p0 + token) % capacity.max(1);
    let first = kept.min(capacity - slot);
    let mut runs = vec![SlotRun {
        token,
        slot,
        count: first,
    }];
    if kept > first {
        runs.push(SlotRun {
            token: token + first,
            slot: 0,
            count: kept - first,
        });
    }
    runs
}

/// Writes one call's `new` keys or values (`[1, heads, sequence, width]`) into `cache`
/// (`[1, heads, capacity, width]`) by `runs`.
pub(crate) fn write_slots(cache: &mut DynValue, new: &[f32], runs: &[SlotRun]) -> Result<()> {
    let t = host_bytes_mut(cache)?;
    let [1, heads, capacity, width] = t.shape[..] else {
        bail!("a fixed-capacity cache tensor of shape {:?}", t.shape);
    };
    let sequence = new.len() / (heads * width).max(1);
    if new.len() != heads * sequence * width {
        bail!("{} new keys are not [1, {heads}, ·, {width}]", new.len());
    }
    if t.element != 4 {
        bail!("the accelerator graphs' cache is float32");
    }
    let row = width * t.element;
    for &SlotRun { token, slot, count } in runs {
        if slot + count > capacity || token + count > sequence {
            bail!(
                "{count} new keys at slot {slot} do not fit a cache of {capacity} slots from a call of {sequence}"
            );
        }
        for h in 0..heads {
            let from = &new[(h * sequence + token) * width..][..count * width];
            let at = (h * capacity + slot) * row;
            t.bytes[at..at + count * row].copy_from_slice(bytemuck_f32(from));
        }
    }
    Ok(())
}

/// Moves one call's `new` QKV-conv rows (`[1, sequence, width]`) of its first `n` tokens
/// into `state` (`[1, slots, width]`), which keeps the last `slots` rows, oldest first.
pub(crate) fn push_rows(state: &mut DynValue, new: &[f32], n: usize) -> Result<()> {
    let t = host_bytes_mut(state)?;
    let [1, slots, width] = t.shape[..] else {
        bail!("a QKV-conv state of shape {:?}", t.shape);
    };
    let row = width * t.element;
    if t.element != 4 || n * width > new.len() {
        bail!("{n} conv rows from a call of {} values", new.len());
    }
    let kept = slots.saturating_sub(n);
    t.bytes.copy_within((slots - kept) * row..slots * row, 0);
    let taken = slots - kept;
    let from = &new[(n - taken) * width..n * width];
    t.bytes[kept * row..slots * row].copy_from_slice(bytemuck_f32(from));
    Ok(())
}

impl Cache {
    /// Marks the slots of `runs` as holding the row's `tokens` at positions `p0 …` (the
    /// accelerator graphs' cache): the mask, and a ring's slot positions.
    pub(crate) fn fill_slots(&mut self, tokens: &[i64], p0: usize, runs: &[SlotRun]) -> Result<()> {
        let Some(fixed) = self.fixed.as_mut() else {
            bail!("not the accelerator graphs' cache");
        };
        let mask = host_bytes_mut(&mut fixed.mask)?;
        let one = 1f32.to_ne_bytes();
        for run in runs {
            let Some(slots) = mask.bytes.get_mut(run.slot * 4..(run.slot + run.count) * 4) else {
                bail!("slots {}+{} past the mask's end", run.slot, run.count);
            };
            for slot in slots.chunks_exact_mut(4) {
                slot.copy_from_slice(&one);
            }
        }
        if let Some(positions) = fixed.positions.as_mut() {
            let positions = host_bytes_mut(positions)?;
            for run in runs {
                let at = run.slot * 4..(run.slot + run.count) * 4;
                let Some(slots) = positions.bytes.get_mut(at) else {
                    bail!("slots {}+{} past the ring's end", run.slot, run.count);
                };
                for (i, slot) in slots.chunks_exact_mut(4).enumerate() {
                    let p = i32::try_from(p0 + run.token + i)?;
                    slot.copy_from_slice(&p.to_ne_bytes());
                }
            }
        }
        fixed.recent.extend(tokens.iter().map(|&t| t as i32));
        let drop = fixed.recent.len().saturating_sub(fixed.history);
        fixed.recent.drain(..drop);
        self.len = p0 + tokens.len();
        Ok(())
    }
}

/// `f32`s as their bytes.
fn bytemuck_f32(values: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes, and u8 has no alignment requirement.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

#[cfg(test)]
mod tests {
    use super::{slot_runs, SlotRun};

    /// Each slot's last writer, token by token, as the ring's definition says: position
    /// `p` in slot `p mod capacity`, a later token replacing an earlier one.
    fn one_by_one(p0: usize, n: usize, capacity: usize) -> Vec<Option<usize>> {
        let mut slots = vec![None; capacity];
        for token in 0..n {
            slots[(p0 + token) % capacity] = Some(token);
        }
        slots
    }

    fn by_runs(runs: &[SlotRun], capacity: usize) -> Vec<Option<usize>> {
        let mut slots = vec![None; capacity];
        for run in runs {
            for i in 0..run.count {
                assert!(
                    slots[run.slot + i].is_none(),
                    "a slot written twice: {runs:?}"
                );
                slots[run.slot + i] = Some(run.token + i);
            }
        }
        slots
    }

    #[test]
    fn ring_runs_write_each_slot_once_with_its_last_token() {
        for capacity in [1, 5, 24] {
            for p0 in 0..3 * capacity {
                for n in 1..3 * capacity {
                    let runs = slot_runs(p0, n, capacity, true);
                    assert!(runs.len() <= 2);
                    assert_eq!(by_runs(&runs, capacity), one_by_one(p0, n, capacity));
                }
            }
        }
    }

    #[test]
    fn without_a_ring_position_p_is_slot_p() {
        let run = SlotRun {
            token: 0,
            slot: 7,
            count: 3,
        };
        assert_eq!(slot_runs(7, 3, 16, false), vec![run]);
    }
}
