//! The block's two residual adds around a ZC-RMS norm (`graphs/src/stream.rs`, `block`):
//! `needle.ResidualNorm`'s `out = x + scale · norm(h)` after attention (the attention
//! output's `post_attn_norm`, its sigmoid gate and the add, three stock nodes a layer in
//! one), and the MLP ops' `out = x + mlp(norm(x))` before it ([`pre_norm_residual`]), with
//! `norm(v) = v / √(mean v² + ε) · gain` per token.

use crate::math::inverse_root_mean_square;
use crate::split::{token_blocks, RowSplit, TokenRun};

/// Tokens a thread takes at once.
const BLOCK_TOKENS: usize = 64;

/// `out` `[tokens, d]` from `x` and `h` (`[tokens, d]` each), `gain` `[d]`.
pub fn residual_norm(
    x: &[f32],
    h: &[f32],
    gain: &[f32],
    scale: f32,
    out: &mut [f32],
    split: &dyn RowSplit,
) {
    let d = gain.len();
    assert!(d > 0, "the norm has a width");
    assert!(
        x.len() == h.len() && x.len() == out.len() && x.len().is_multiple_of(d),
        "x, h and out are [tokens, d]"
    );
    token_blocks(split, out, d, BLOCK_TOKENS, AddRun { x, h, gain, scale });
}

/// [`residual_norm`] of a run of tokens.
struct AddRun<'a> {
    x: &'a [f32],
    h: &'a [f32],
    gain: &'a [f32],
    scale: f32,
}

impl TokenRun for AddRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let d = self.gain.len();
        for (t, out) in (first..).zip(block.chunks_exact_mut(d)) {
            let (x, h) = (&self.x[t * d..(t + 1) * d], &self.h[t * d..(t + 1) * d]);
            let inverse = inverse_root_mean_square(h);
            for (((o, &x), &h), &g) in out.iter_mut().zip(x).zip(h).zip(self.gain) {
                *o = x + self.scale * (h * inverse * g);
            }
        }
    }
}

/// An MLP over a run of tokens: `mlp(normed, tokens, out)`, `[tokens, d]` each.
pub type TokensMlp<'a> = dyn Fn(&[f32], usize, &mut [f32]) + Sync + 'a;

/// `out` `[tokens, d]` = `x + mlp(norm(x))` from `x` `[tokens, d]` and `gain` `[d]`, where
/// `mlp(normed, tokens, out)` writes a run of tokens' MLP output (`[tokens, d]` each); runs of
/// up to `block` tokens spread by `split`.
pub fn pre_norm_residual(
    x: &[f32],
    gain: &[f32],
    out: &mut [f32],
    block: usize,
    split: &dyn RowSplit,
    mlp: &TokensMlp,
) {
    let d = gain.len();
    assert!(d > 0, "the norm has a width");
    assert!(
        x.len() == out.len() && x.len().is_multiple_of(d),
        "x and out are [tokens, d]"
    );
    token_blocks(split, out, d, block, MlpRun { x, gain, mlp });
}

/// [`pre_norm_residual`] of a run of tokens.
struct MlpRun<'a> {
    x: &'a [f32],
    gain: &'a [f32],
    mlp: &'a TokensMlp<'a>,
}

impl TokenRun for MlpRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, out: &mut [f32]) {
        let d = self.gain.len();
        let tokens = out.len() / d;
        let x = &self.x[first * d..(first + tokens) * d];
        let mut normed = vec![0.0f32; x.len()];
        for (normed, x) in normed.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            let inverse = inverse_root_mean_square(x);
            for ((n, &x), &g) in normed.iter_mut().zip(x).zip(self.gain) {
                *n = x * inverse * g;
            }
        }
        (self.mlp)(&normed, tokens, out);
        out.iter_mut().zip(x).for_each(|(o, &x)| *o += x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    #[test]
    fn matches_the_formula() {
        let d = 6;
        let x: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.3).sin()).collect();
        let h: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.7).cos() * 3.0).collect();
        let gain: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 * 0.1).collect();
        let mut out = vec![f32::NAN; x.len()];
        residual_norm(&x, &h, &gain, 0.75, &mut out, &Serial);
        for t in 0..3 {
            let h = &h[t * d..(t + 1) * d];
            let rms =
                (h.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64 + 1e-6).sqrt();
            for j in 0..d {
                let want = x[t * d + j] as f64 + 0.75 * h[j] as f64 / rms * gain[j] as f64;
                assert!((out[t * d + j] as f64 - want).abs() < 1e-6, "({t}, {j})");
            }
        }
    }

    #[test]
    fn pre_norm_residual_adds_the_mlp_of_the_normed_rows() {
        let d = 4;
        let x: Vec<f32> = (0..5 * d).map(|i| (i as f32 * 0.45).cos() * 2.0).collect();
        let gain: Vec<f32> = (0..d).map(|i| 0.8 + i as f32 * 0.15).collect();
        // An "MLP" that reverses each token's row and doubles it: position-dependent, so a
        // token or a row read out of place shows.
        let mlp = |normed: &[f32], tokens: usize, out: &mut [f32]| {
            assert_eq!(normed.len(), tokens * d);
            for (out, normed) in out.chunks_exact_mut(d).zip(normed.chunks_exact(d)) {
                for (o, &n) in out.iter_mut().zip(normed.iter().rev()) {
                    *o = 2.0 * n;
                }
            }
        };
        let mut out = vec![f32::NAN; x.len()];
        pre_norm_residual(&x, &gain, &mut out, 2, &Serial, &mlp);
        for t in 0..5 {
            let x = &x[t * d..(t + 1) * d];
            let rms =
                (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64 + 1e-6).sqrt();
            for j in 0..d {
                let normed = x[d - 1 - j] as f64 / rms * gain[d - 1 - j] as f64;
                let want = x[j] as f64 + 2.0 * normed;
                assert!((out[t * d + j] as f64 - want).abs() < 1e-6, "({t}, {j})");
            }
        }
    }
}
