//! `needle.HadamardMlp`: Needle 2's MLP (`graphs/src/needle2/hadamard_mlp.rs` states it)
//! for every token in one call, with its pre-norm and residual add, where the stock graph
//! runs ~16 nodes a layer: `mlp(x) = (d3 · H · silu(d2 · H · (d1 · x)))[:d_model]`, `x` zero-padded to `n` and `H` the
//! orthonormal Walsh–Hadamard matrix of size `n`, applied as the fast transform.

use crate::hadamard::rotate_groups;
use crate::isa::{Isa, Vectorized};
use crate::math::silu;
use crate::residual_norm::pre_norm_residual;
use crate::split::RowSplit;

/// Tokens a thread takes at once.
const BLOCK_TOKENS: usize = 16;

/// The three diagonals `d1`, `d2`, `d3`, each `[n]` (a power of two ≥ `d_model`).
#[derive(Clone, Copy, Debug)]
pub struct HadamardMlp<'a> {
    pub diagonals: [&'a [f32]; 3],
    /// The path the rotations and the SiLU run on (every path gives the same bits).
    pub isa: Isa,
}

impl HadamardMlp<'_> {
    /// `None` unless the diagonals share a power-of-two width of at least `d_model`.
    pub fn width(&self, d_model: usize) -> Option<usize> {
        let n = self.diagonals[0].len();
        let fits = n.is_power_of_two() && n >= d_model && d_model > 0;
        (fits && self.diagonals.iter().all(|d| d.len() == n)).then_some(n)
    }

    /// The layer's MLP half: `out = x + mlp(norm(x))` `[tokens, d_model]` from `x`
    /// `[tokens, d_model]` and the pre-MLP norm's `gain` `[d_model]` (`norm` as
    /// [`pre_norm_residual`] has it), runs of tokens spread by `split`. The diagonals must fit
    /// `d_model` ([`HadamardMlp::width`]).
    pub fn apply(&self, x: &[f32], gain: &[f32], out: &mut [f32], split: &dyn RowSplit) {
        pre_norm_residual(x, gain, out, BLOCK_TOKENS, split, &|normed, _, out| {
            self.tokens(normed, gain.len(), out)
        });
    }

    /// `out` `[tokens, d_model]` = the MLP of `x` `[tokens, d_model]`, on the calling thread,
    /// its SiLU and diagonals compiled for the path's vector width ([`Isa::vectorized`]; the
    /// same arithmetic, so the same bits).
    pub fn tokens(&self, x: &[f32], d_model: usize, out: &mut [f32]) {
        self.isa.vectorized(Tokens {
            mlp: self,
            x,
            d_model,
            out,
        })
    }

    #[inline(always)]
    fn tokens_on(&self, x: &[f32], d_model: usize, out: &mut [f32]) {
        let n = self
            .width(d_model)
            .expect("diagonals checked against d_model");
        assert_eq!(x.len(), out.len(), "out is shaped like x");
        let [d1, d2, d3] = self.diagonals;
        let mut z = vec![0.0f32; n];
        for (x, out) in x.chunks_exact(d_model).zip(out.chunks_exact_mut(d_model)) {
            z.fill(0.0);
            z.iter_mut()
                .zip(x)
                .zip(d1)
                .for_each(|((z, &x), &d)| *z = d * x);
            rotate_groups(self.isa, &mut z, n);
            z.iter_mut().zip(d2).for_each(|(z, &d)| *z = silu(d * *z));
            rotate_groups(self.isa, &mut z, n);
            out.iter_mut()
                .zip(&z)
                .zip(d3)
                .for_each(|((o, &z), &d)| *o = d * z);
        }
    }
}

/// [`HadamardMlp::tokens`] as [`Isa::vectorized`] takes it.
struct Tokens<'a> {
    mlp: &'a HadamardMlp<'a>,
    x: &'a [f32],
    d_model: usize,
    out: &'a mut [f32],
}

impl Vectorized for Tokens<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        self.mlp.tokens_on(self.x, self.d_model, self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three diagonals of width `n`: diagonal `k` (1, 2, 3) holds `0.5 + ((i·k) mod m)·step`.
    fn diagonals(n: usize, m: usize, step: f32) -> [Vec<f32>; 3] {
        std::array::from_fn(|k| {
            (0..n)
                .map(|i| 0.5 + ((i * (k + 1)) % m) as f32 * step)
                .collect()
        })
    }

    /// Against the formula in f64 with the dense matrix: d_model 6 in n = 8, two tokens.
    #[test]
    fn matches_the_dense_formula() {
        let (d, n) = (6, 8);
        let [d1, d2, d3] = diagonals(n, 5, 0.1);
        let x: Vec<f32> = (0..2 * d).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut out = vec![f32::NAN; x.len()];
        HadamardMlp {
            diagonals: [&d1, &d2, &d3],
            isa: Isa::Scalar,
        }
        .tokens(&x, d, &mut out);
        let h = |i: usize, j: usize| {
            let sign = if (i & j).count_ones().is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            sign / (n as f64).sqrt()
        };
        for t in 0..2 {
            let z: Vec<f64> = (0..n)
                .map(|i| {
                    if i < d {
                        d1[i] as f64 * x[t * d + i] as f64
                    } else {
                        0.0
                    }
                })
                .collect();
            let z: Vec<f64> = (0..n)
                .map(|i| d2[i] as f64 * (0..n).map(|j| h(i, j) * z[j]).sum::<f64>())
                .collect();
            let z: Vec<f64> = z.iter().map(|v| v / (1.0 + (-v).exp())).collect();
            for i in 0..d {
                let want = d3[i] as f64 * (0..n).map(|j| h(i, j) * z[j]).sum::<f64>();
                let got = out[t * d + i] as f64;
                assert!(
                    (got - want).abs() < 1e-6,
                    "token {t} output {i}: {got} vs {want}"
                );
            }
        }
        let mlp = HadamardMlp {
            diagonals: [&d1, &d2, &d3],
            isa: Isa::Scalar,
        };
        assert_eq!(mlp.width(9), None);
    }

    /// Every path gives the scalar path's bits, at a width whose rotations the SIMD
    /// paths take (d_model 40 in n = 64, three tokens).
    #[test]
    fn every_path_gives_the_same_bits() {
        let (d, n) = (40, 64);
        let [d1, d2, d3] = diagonals(n, 7, 0.13);
        let x: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.61).sin()).collect();
        let run = |isa| {
            let mut out = vec![f32::NAN; x.len()];
            HadamardMlp {
                diagonals: [&d1, &d2, &d3],
                isa,
            }
            .tokens(&x, d, &mut out);
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let want = run(Isa::Scalar);
        for isa in Isa::available() {
            assert_eq!(run(isa), want, "{}", isa.name());
        }
    }
}
