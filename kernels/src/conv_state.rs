//! `needle.ConvState`: Needle 3's next QKV-conv state, each row's last `taps − 1` real
//! positions of the conv's window (`graphs/src/needle3/attention.rs`, `next_conv_state`):
//!
//! ```text
//! window = [state (taps − 1 rows); projections[.., :width] (sequence rows)]     next[b, r] = window[b, real_new[b] + r]
//! ```
//! A row's real new tokens come first in its chunk (right padding), so its last `taps − 1`
//! real rows of the window start at row `real_new`. The Slice, Concat, Add, Expand and
//! GatherElements of the stock graph in one.

use crate::ShapeError;

/// The conv's window of a batch: the state and this call's projections.
#[derive(Clone, Copy, Debug)]
pub struct ConvWindow<'a> {
    /// `[batch, taps − 1, width]`.
    pub state: &'a [f32],
    /// `[batch, sequence, projections_width]`, the conv's columns first.
    pub projections: &'a [f32],
    pub projections_width: usize,
    pub batch: usize,
    pub sequence: usize,
    /// The conv's columns (`≤ projections_width`).
    pub width: usize,
}

impl ConvWindow<'_> {
    /// Rows of the state, `taps − 1`, every size checked against the others.
    pub fn state_rows(&self) -> Result<usize, ShapeError> {
        let row = self.batch * self.width;
        let rows = self.state.len().checked_div(row).unwrap_or(0);
        if row == 0 || rows * row != self.state.len() {
            return Err(ShapeError(format!(
                "a state of {} values is not [{}, rows, {}]",
                self.state.len(),
                self.batch,
                self.width
            )));
        }
        if self.width > self.projections_width
            || self.projections.len() != self.batch * self.sequence * self.projections_width
        {
            return Err(ShapeError(format!(
                "projections of {} values are not [{}, {}, {} ≥ {}]",
                self.projections.len(),
                self.batch,
                self.sequence,
                self.projections_width,
                self.width
            )));
        }
        Ok(rows)
    }

    /// Window row `r` of batch row `b` (its `rows` state rows first, then the projections'),
    /// the conv's `width` columns.
    pub fn row(&self, b: usize, rows: usize, r: usize) -> &[f32] {
        match r.checked_sub(rows) {
            None => &self.state[(b * rows + r) * self.width..][..self.width],
            Some(t) => {
                &self.projections[(b * self.sequence + t) * self.projections_width..][..self.width]
            }
        }
    }
}

/// `next` `[batch, taps − 1, width]` from `window` and each row's count of real new tokens
/// `real_new` `[batch]` (`≤ sequence`).
pub fn conv_state(
    window: &ConvWindow,
    real_new: &[i64],
    next: &mut [f32],
) -> Result<(), ShapeError> {
    let rows = window.state_rows()?;
    let sequence = window.sequence;
    if real_new.len() != window.batch || next.len() != window.state.len() {
        return Err(ShapeError(format!(
            "{} counts of new tokens and a next state of {} values do not fit a batch of {}",
            real_new.len(),
            next.len(),
            window.batch
        )));
    }
    for (b, (next, &new)) in next
        .chunks_exact_mut(rows * window.width)
        .zip(real_new)
        .enumerate()
    {
        let new = usize::try_from(new)
            .ok()
            .filter(|&n| n <= sequence)
            .ok_or_else(|| {
                ShapeError(format!("row {b} has {new} new tokens, not 0 to {sequence}"))
            })?;
        for (r, next) in next.chunks_exact_mut(window.width).enumerate() {
            next.copy_from_slice(window.row(b, rows, new + r));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows, taps − 1 = 2, width 2 of projections 3 wide, sequence 3: row 0 with 3 new
    /// tokens (its state all from the projections), row 1 with 1 (one state row kept).
    #[test]
    fn takes_each_rows_last_real_positions() {
        let state: Vec<f32> = (0..2 * 2 * 2).map(|i| 100.0 + i as f32).collect();
        let projections: Vec<f32> = (0..2 * 3 * 3).map(|i| i as f32).collect();
        let window = ConvWindow {
            state: &state,
            projections: &projections,
            projections_width: 3,
            batch: 2,
            sequence: 3,
            width: 2,
        };
        let mut next = vec![f32::NAN; 8];
        conv_state(&window, &[3, 1], &mut next).unwrap();
        // Row 0: projections tokens 1 and 2; row 1: its state's row 1, then token 0.
        assert_eq!(next, [3.0, 4.0, 6.0, 7.0, 106.0, 107.0, 9.0, 10.0]);
        let too_many = conv_state(&window, &[4, 1], &mut next).unwrap_err();
        assert_eq!(too_many.0, "row 0 has 4 new tokens, not 0 to 3");
    }
}
