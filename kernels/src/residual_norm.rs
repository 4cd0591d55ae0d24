//! `needle.ResidualNorm`: a sandwich norm's residual add, `out = x + scale · (h / √(mean h² + ε)
//! · gain)` per token (`graphs/src/stream.rs`, `block`: the attention output's
//! `post_attn_norm`, its sigmoid gate and the add), three stock nodes a layer in one.

use crate::split::{token_blocks, RowSplit};

const EPSILON: f32 = 1e-6;
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
    token_blocks(split, out, d, BLOCK_TOKENS, &|first, block| {
        for (t, out) in (first..).zip(block.chunks_exact_mut(d)) {
            let (x, h) = (&x[t * d..(t + 1) * d], &h[t * d..(t + 1) * d]);
            let mean = h.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let root = (mean + EPSILON).sqrt();
            for (((o, &x), &h), &g) in out.iter_mut().zip(x).zip(h).zip(gain) {
                *o = x + scale * (h / root * g);
            }
        }
    });
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
}
