//! The AVX-512 product of a matrix of few rows (the hyper-connections' next projection: 24
//! rows of a 2048-wide stream) with a prompt. Its rows are dequantized once a call as
//! upstream decodes them (`(codebook[idx] · norm) H`, the row scale's gain folded in) and
//! laid out input by input, the rows of an input side by side in lanes; each token's
//! outputs are then summed in registers with its inputs broadcast as they come. The
//! panels' way rotated and transposed every token's inputs (2048 values) for 24 rows'
//! products, most of that op's time.
//!
//! Each output is one running sum over the inputs in order, scaled by the token's
//! `1 / RMS` at the end where the rows are unit-scaled: a token gets the same bits in any
//! call that takes this path, and within rounding what the other paths give it.

use super::{Aligned, CqMatrix, RowScale};
use crate::isa::Isa;
use crate::math::inverse_root_mean_square;
use crate::split::{token_blocks, RowSplit};
use crate::transpose::{transpose, Strided};
use std::arch::x86_64::*;

/// The most rows this path takes: two registers of lanes.
pub(super) const MOST_ROWS: usize = 32;

/// Tokens summed at once: `2 · TILE` sums and two weight registers fit the 32 registers.
const TILE: usize = 12;

/// `y` `[tokens, rows]` = `x` `[tokens, cols]` (scaled by `scale`) times `w`ᵀ, runs of
/// tokens spread by `split`.
///
/// # Safety
/// The CPU must have AVX-512F, and `w` has at most [`MOST_ROWS`] rows.
pub(super) unsafe fn product(
    w: &CqMatrix,
    x: &[f32],
    scale: RowScale,
    y: &mut [f32],
    split: &dyn RowSplit,
) {
    debug_assert!(w.rows <= MOST_ROWS && x.len() / w.cols == y.len() / w.rows);
    let weights = by_input(w, scale.gain);
    let weights = weights.as_slice();
    token_blocks(
        split,
        y,
        w.rows,
        4 * TILE,
        |first: usize, out: &mut [f32]| {
            let count = out.len() / w.rows;
            let x = &x[first * w.cols..(first + count) * w.cols];
            for (t, tile) in (0..count).step_by(TILE).zip(out.chunks_mut(TILE * w.rows)) {
                let tokens = tile.len() / w.rows;
                let x = &x[t * w.cols..(t + tokens) * w.cols];
                // Sound: the caller's promise (AVX-512F, at most 32 rows).
                unsafe {
                    match tokens {
                        TILE => tile_product::<TILE>(weights, x, w, scale, tile),
                        _ => tail_product(weights, x, w, scale, tile, tokens),
                    }
                }
            }
        },
    );
}

/// The rows dequantized, `[cols, 32]`: input `k`'s rows side by side (zeros past the
/// last row), each times `gain[k]` where given; each row as
/// [`CqMatrix::decode_row_into`] has it on AVX-512.
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn by_input(w: &CqMatrix, gain: Option<&[f32]>) -> Aligned {
    let in_pad = w.groups() * w.group;
    // Both buffers are the thread's, kept between products (fresh ones page-faulted every
    // call); every value read is written first.
    // All 32 rows, zeros past the matrix's: the transposition then moves whole 16 × 16
    // blocks (the rows past the last block went one value at a time, ~0.5% of a prompt).
    let mut rows = Aligned::reused(&super::PREPARED, MOST_ROWS * in_pad);
    let (real, padding) = rows.as_mut_slice().split_at_mut(w.rows * in_pad);
    for (r, row) in real.chunks_exact_mut(in_pad).enumerate() {
        w.decode_row_into(Isa::Avx512, r, row);
        if let Some(gain) = gain {
            row.iter_mut().zip(gain).for_each(|(v, &g)| *v *= g);
        }
    }
    padding.fill(0.0);
    let mut out = Aligned::reused(&super::PANELS, w.cols * MOST_ROWS);
    let rows = Strided {
        data: rows.as_slice(),
        stride: in_pad,
    };
    transpose(
        Isa::Avx512,
        rows,
        MOST_ROWS,
        w.cols,
        out.as_mut_slice(),
        MOST_ROWS,
    );
    out
}

/// The last tile of a run: `tokens` (< [`TILE`]) of them.
#[target_feature(enable = "avx512f")]
unsafe fn tail_product(
    weights: &[f32],
    x: &[f32],
    w: &CqMatrix,
    scale: RowScale,
    out: &mut [f32],
    tokens: usize,
) {
    macro_rules! tile {
        ($($n:literal)*) => {
            match tokens {
                $($n => tile_product::<$n>(weights, x, w, scale, out),)*
                _ => unreachable!("a tail holds fewer than TILE tokens"),
            }
        };
    }
    tile!(1 2 3 4 5 6 7 8 9 10 11)
}

/// `T` tokens' outputs: for every input, its 32 rows' weights (two registers) times the
/// token's input, broadcast, summed in order; then each token's sums times its `1 / RMS`
/// where the rows are unit-scaled.
#[target_feature(enable = "avx512f")]
unsafe fn tile_product<const T: usize>(
    weights: &[f32],
    x: &[f32],
    w: &CqMatrix,
    scale: RowScale,
    out: &mut [f32],
) {
    let cols = w.cols;
    debug_assert!(x.len() == T * cols && out.len() == T * w.rows);
    debug_assert_eq!(weights.len(), cols * MOST_ROWS);
    let tokens: [*const f32; T] = std::array::from_fn(|t| x.as_ptr().add(t * cols));
    let mut sums = [[_mm512_setzero_ps(); 2]; T];
    for k in 0..cols {
        // Sound: input k's 32 weights are within `weights` (`[cols, 32]`), and every
        // token holds `cols` inputs.
        let w0 = _mm512_loadu_ps(weights.as_ptr().add(k * MOST_ROWS));
        let w1 = _mm512_loadu_ps(weights.as_ptr().add(k * MOST_ROWS + 16));
        for (sum, token) in sums.iter_mut().zip(tokens) {
            let x = _mm512_set1_ps(*token.add(k));
            sum[0] = _mm512_fmadd_ps(x, w0, sum[0]);
            sum[1] = _mm512_fmadd_ps(x, w1, sum[1]);
        }
    }
    let (low, high) = lanes(w.rows);
    for (t, sum) in sums.iter().enumerate() {
        let inverse = match scale.unit_rows {
            true => inverse_root_mean_square(&x[t * cols..(t + 1) * cols]),
            false => 1.0,
        };
        let inverse = _mm512_set1_ps(inverse);
        // Sound: token t's `rows` outputs are within `out`, where the masks have lanes.
        let at = out.as_mut_ptr().add(t * w.rows);
        _mm512_mask_storeu_ps(at, low, _mm512_mul_ps(sum[0], inverse));
        _mm512_mask_storeu_ps(at.wrapping_add(16), high, _mm512_mul_ps(sum[1], inverse));
    }
}

/// The lanes of the two registers that hold rows.
fn lanes(rows: usize) -> (__mmask16, __mmask16) {
    let mask = |count: usize| ((1u32 << count.min(16)) - 1) as __mmask16;
    (mask(rows), mask(rows.saturating_sub(16)))
}
