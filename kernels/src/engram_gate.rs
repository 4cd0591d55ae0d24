//! `needle.EngramGate`: an engram site's addition to the block input, per token
//! (`graphs/src/blocks/engram.rs`, `inject`): with `x̂ = x / √(mean x² + ε)` (`rms_unit`),
//! `out = x + σ(⟨x̂, k̂⟩ / √d) · value`, `k̂` the site's key already unit-RMS normalised.
//! Seven stock nodes a site in one.

use crate::math::{exp, inverse_root_mean_square};
use crate::split::{token_blocks, RowSplit, TokenRun};

/// Tokens a thread takes at once.
const BLOCK_TOKENS: usize = 64;

/// `out` `[tokens, d]` from `x`, `key_unit` and `value` (`[tokens, d]` each).
pub fn engram_gate(
    x: &[f32],
    key_unit: &[f32],
    value: &[f32],
    d: usize,
    out: &mut [f32],
    split: &dyn RowSplit,
) {
    assert!(d > 0, "d_model is positive");
    for (name, len) in [
        ("key_unit", key_unit.len()),
        ("value", value.len()),
        ("out", out.len()),
    ] {
        assert_eq!(len, x.len(), "{name} is shaped like x");
    }
    let work = GateRun {
        x,
        key_unit,
        value,
        d,
    };
    token_blocks(split, out, d, BLOCK_TOKENS, work);
}

/// [`engram_gate`] of a run of tokens.
struct GateRun<'a> {
    x: &'a [f32],
    key_unit: &'a [f32],
    value: &'a [f32],
    d: usize,
}

impl TokenRun for GateRun<'_> {
    #[inline(always)]
    fn run(&self, first: usize, block: &mut [f32]) {
        let d = self.d;
        for (t, out) in (first..).zip(block.chunks_exact_mut(d)) {
            let rows = t * d..(t + 1) * d;
            let (x, key, value) = (
                &self.x[rows.clone()],
                &self.key_unit[rows.clone()],
                &self.value[rows],
            );
            let inverse_root = inverse_root_mean_square(x);
            let dot: f32 = x.iter().zip(key).map(|(x, k)| x * inverse_root * k).sum();
            let logit = dot / (d as f64).sqrt() as f32;
            let alpha = 1.0 / (1.0 + exp(-logit));
            for ((o, &x), &v) in out.iter_mut().zip(x).zip(value) {
                *o = x + alpha * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    #[test]
    fn matches_the_formula() {
        let d = 5;
        let x: Vec<f32> = (0..2 * d).map(|i| (i as f32 * 0.9).sin()).collect();
        let key: Vec<f32> = (0..2 * d).map(|i| (i as f32 * 0.4).cos()).collect();
        let value: Vec<f32> = (0..2 * d).map(|i| i as f32 * 0.1 - 0.3).collect();
        let mut out = vec![f32::NAN; x.len()];
        engram_gate(&x, &key, &value, d, &mut out, &Serial);
        for t in 0..2 {
            let row = |v: &[f32]| {
                v[t * d..(t + 1) * d]
                    .iter()
                    .map(|&v| v as f64)
                    .collect::<Vec<_>>()
            };
            let (x, k, v) = (row(&x), row(&key), row(&value));
            let rms = (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-6).sqrt();
            let dot: f64 = x.iter().zip(&k).map(|(x, k)| x / rms * k).sum();
            let alpha = 1.0 / (1.0 + (-dot / (d as f64).sqrt()).exp());
            for j in 0..d {
                let want = x[j] + alpha * v[j];
                assert!((out[t * d + j] as f64 - want).abs() < 1e-6, "({t}, {j})");
            }
        }
    }
}
