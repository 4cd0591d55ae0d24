//! The accelerator graphs' cache (`needle-export --target`): every layer's keys and values
//! in buffers of the graphs' fixed capacity, slot `p` holding position `p`, which each
//! call's `new_key_values.*` are written into at the call's positions (in place: a step
//! copies only its own tokens' keys and values); the mask over the slots; Needle 3's
//! QKV-conv state; and the row's last tokens, which the graphs read as `token_window`.

use super::host::host_bytes_mut;
use super::Cache;
use anyhow::{bail, Result};
use ort::value::DynValue;

/// What the caller of the accelerator graphs keeps besides the keys, values and conv state.
pub struct FixedSlots {
    /// float32 `[1, capacity]`: 1 for the slots that hold the row's tokens.
    pub(crate) mask: DynValue,
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

/// Writes one call's `new` keys or values (`[1, heads, sequence, width]`) of its first
/// `n` tokens into `cache` (`[1, heads, capacity, width]`) at slots `p0 … p0 + n − 1`.
pub(crate) fn write_slots(cache: &mut DynValue, new: &[f32], p0: usize, n: usize) -> Result<()> {
    let t = host_bytes_mut(cache)?;
    let [1, heads, capacity, width] = t.shape[..] else {
        bail!("a fixed-capacity cache tensor of shape {:?}", t.shape);
    };
    let sequence = new.len() / (heads * width).max(1);
    if p0 + n > capacity || n > sequence || new.len() != heads * sequence * width {
        bail!(
            "{n} new keys at slot {p0} do not fit a cache of {capacity} slots from a call of {sequence}"
        );
    }
    if t.element != 4 {
        bail!("the accelerator graphs' cache is float32");
    }
    let row = width * t.element;
    for h in 0..heads {
        let from = &new[h * sequence * width..][..n * width];
        let at = (h * capacity + p0) * row;
        t.bytes[at..at + n * row].copy_from_slice(bytemuck_f32(from));
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
    /// Marks slots `p0 … p0 + n − 1` as holding the row's `tokens` (the accelerator
    /// graphs' cache).
    pub(crate) fn fill_slots(&mut self, tokens: &[i64], p0: usize) -> Result<()> {
        let Some(fixed) = self.fixed.as_mut() else {
            bail!("not the accelerator graphs' cache");
        };
        let mask = host_bytes_mut(&mut fixed.mask)?;
        if (p0 + tokens.len()) * 4 > mask.bytes.len() {
            bail!("slots {p0}+{} past the mask's end", tokens.len());
        }
        let one = 1f32.to_ne_bytes();
        for slot in mask.bytes[p0 * 4..(p0 + tokens.len()) * 4].chunks_exact_mut(4) {
            slot.copy_from_slice(&one);
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
