//! The AVX-512 prompt product: the prepared tokens transposed into panels of 32 (an
//! input's 32 activations side by side, one per lane), each row block's weights decoded
//! with their norms once, and every panel multiplied by them with tokens in lanes
//! ([`super::avx512::panel_dots`]). Each output is one running multiply-add over the inputs
//! in order, whatever the panel or the thread: a token gets the same bits in any call of
//! `PANELS_FROM_TOKENS` or more, and within rounding what the one-token lookups give it
//! (which sum sixteen lanes a group, then scale by the norm).

use super::{Aligned, CqMatrix, Output, Table};
use crate::isa::Isa;
use crate::split::{token_blocks, RowSplit};
use crate::transpose::{transpose, Strided};
use std::ops::Range;

/// Tokens a panel holds: two registers of lanes.
pub(super) const PANEL_TOKENS: usize = 32;

/// Rows multiplied with a panel at once: `2 · ROWS` sums and two panel registers fit the
/// 32 registers, and a broadcast weight feeds two multiply-adds.
const ROWS: usize = 8;
const _: () = assert!(
    ROWS == 8,
    "a row block's sums are stored transposed 8 rows at a time"
);

/// The prepared tokens `[tokens, len]` as panels: panel `p` holds tokens `32p…` input by
/// input, `width` lanes each (32, or 16 for a last panel of at most 16 tokens), padded
/// with zeros.
pub(super) struct Panels {
    data: Aligned,
    tokens: usize,
    len: usize,
}

impl Panels {
    /// The panels of `prepared`, spread by `split` a panel at a time.
    pub fn of(prepared: &[f32], tokens: usize, len: usize, split: &dyn RowSplit) -> Panels {
        debug_assert_eq!(prepared.len(), tokens * len);
        let full = tokens / PANEL_TOKENS * PANEL_TOKENS;
        let last = match tokens - full {
            0 => 0,
            1..=16 => 16,
            _ => PANEL_TOKENS,
        };
        let mut data = Aligned::reused(&super::PANELS, (full + last) * len);
        // A panel is `len` rows of its width: as many values as `width` tokens.
        token_blocks(
            split,
            data.as_mut_slice(),
            len,
            PANEL_TOKENS,
            |first: usize, panel: &mut [f32]| {
                let width = if first < full { PANEL_TOKENS } else { last };
                let count = PANEL_TOKENS.min(tokens - first);
                let real = Strided {
                    data: &prepared[first * len..(first + count) * len],
                    stride: len,
                };
                transpose(Isa::Avx512, real, count, len, panel, width);
                // The lanes past a last panel's tokens are summed and never written: zeros,
                // so that they hold no slow (subnormal) leftovers.
                for lane in count..width {
                    panel
                        .iter_mut()
                        .skip(lane)
                        .step_by(width)
                        .for_each(|v| *v = 0.0);
                }
            },
        );
        Panels { data, tokens, len }
    }

    /// Each panel: its first token, its tokens, its width and its values.
    fn each(&self) -> impl Iterator<Item = (usize, usize, usize, &[f32])> {
        let data = self.data.as_slice();
        (0..self.tokens).step_by(PANEL_TOKENS).map(move |first| {
            let count = PANEL_TOKENS.min(self.tokens - first);
            let width = if count > 16 { PANEL_TOKENS } else { 16 };
            let start = first * self.len;
            (first, count, width, &data[start..start + width * self.len])
        })
    }
}

/// Rows `rows` of `w` times every token of `panels` into `out` (`[tokens, w.rows]`);
/// `norms` are the block's group norms as f32 (`[rows, groups]`).
///
/// # Safety
/// The CPU must have AVX-512F, and the matrix's layout must be the 16-lane one (1-, 2- or
/// 4-bit codes in groups of whole chunks), which the panels' tokens are arranged in.
pub(super) unsafe fn rows_block(
    w: &CqMatrix,
    rows: Range<usize>,
    panels: &Panels,
    table: &Table,
    norms: &[f32],
    out: &Output,
) {
    let (groups, len) = (w.groups(), panels.len);
    // Rows past a last group's count keep earlier rows' weights (decoded values, finite):
    // their sums are not written.
    let mut weights = Aligned::reused(&super::BLOCK_SCRATCH, ROWS * len);
    let mut sums = [[0.0f32; PANEL_TOKENS]; ROWS];
    for first in rows.clone().step_by(ROWS) {
        let count = ROWS.min(rows.end - first);
        for (j, row) in weights
            .as_mut_slice()
            .chunks_exact_mut(len)
            .take(count)
            .enumerate()
        {
            let at = (first + j - rows.start) * groups;
            super::avx512::decode_weights(
                w.row_codes(first + j),
                w.bits,
                &table.values,
                &norms[at..at + groups],
                w.group,
                row,
            );
        }
        let weights: [&[f32]; ROWS] =
            std::array::from_fn(|j| &weights.as_slice()[j * len..(j + 1) * len]);
        for (first_token, tokens, width, panel) in panels.each() {
            match width {
                PANEL_TOKENS => super::avx512::panel_dots::<ROWS, 2>(weights, panel, &mut sums),
                _ => super::avx512::panel_dots::<ROWS, 1>(weights, panel, &mut sums),
            }
            // A token's rows lie side by side in `out`.
            let at = |t: usize| (first_token + t) * w.rows + first;
            let whole = match count {
                ROWS => tokens / 16 * 16,
                _ => 0,
            };
            for t in (0..whole).step_by(16) {
                let lanes = std::array::from_fn(|j| {
                    let lanes: &[f32; 16] = sums[j][t..t + 16].try_into().expect("16 lanes");
                    lanes
                });
                // Sound: rows first…first + 8 belong to this block alone, and the tokens
                // are the product's.
                super::avx512::store_transposed(lanes, out.0.add(at(t)), w.rows);
            }
            for t in whole..tokens {
                for (j, row_sums) in sums.iter().enumerate().take(count) {
                    // Sound: as above.
                    *out.0.add(at(t) + j) = row_sums[t];
                }
            }
        }
    }
}
