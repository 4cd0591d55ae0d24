//! `needle.MonarchMlp`: Needle 3's MLP (upstream `HadamardMLP` of 3.2.8) for every token in
//! one call, where the stock graph runs about 27 nodes a layer. With `x` zero-padded to
//! `n = a·b` and `Kₛ(z) = Aₛᵀ · Z · Bₛ` (`z` viewed as an `a × b` matrix):
//!
//! ```text
//! cond = 1 + softmax(x·cond_v)·cond_u
//! z = K₁(d1·x)[p1];  z = silu((d2·z)·cond + b2);  z = K₂(z)[p2];  z = K₃(d3·z);  out = (d4·z)[:d_model]
//! ```
//!
//! The op runs it as the layer's MLP half, `out = x + mlp(norm(x))` with the pre-MLP
//! ZC-RMS norm ([`MonarchMlp::apply`]).
//!
//! Each token's output depends on that token alone and is computed in the same order
//! whatever the batch, so a row of a batch gets the bits it gets alone.

use crate::isa::{Isa, Vectorized};
use crate::math::{silu, softmax};
use crate::residual_norm::pre_norm_residual;
use crate::small_matmul::matmul;
use crate::split::RowSplit;
use crate::ShapeError;

/// Tokens a thread takes at once: enough rows for the `Z·B` products to run long.
const BLOCK_TOKENS: usize = 16;

/// One Kronecker stage: `Aᵀ` `[a, a]` and `B` `[b, b]`.
#[derive(Clone, Copy, Debug)]
pub struct KronFactors<'a> {
    pub a_t: &'a [f32],
    pub b: &'a [f32],
}

/// The weights of one layer's MLP, their sizes checked against each other.
#[derive(Clone, Copy, Debug)]
pub struct MonarchMlp<'a> {
    d_model: usize,
    n: usize,
    rank: usize,
    a: usize,
    b: usize,
    cond_v: &'a [f32],
    cond_u: &'a [f32],
    /// `d1`, `d2`, `d3`, `d4`, each `[n]`.
    diagonals: [&'a [f32]; 4],
    b2: &'a [f32],
    stages: [KronFactors<'a>; 3],
    /// `p1`, `p2`: `z[.., p[j]]` is output `j`.
    permutations: [&'a [i64]; 2],
}

impl<'a> MonarchMlp<'a> {
    /// `cond_v` `[d_model, rank]`, `cond_u` `[rank, n]`, the diagonals and `b2` `[n]`, each
    /// stage's `Aᵀ` `[a, a]` and `B` `[b, b]` with `a·b = n ≥ d_model`, the permutations
    /// `[n]` of indices below `n`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        d_model: usize,
        cond_v: &'a [f32],
        cond_u: &'a [f32],
        diagonals: [&'a [f32]; 4],
        b2: &'a [f32],
        stages: [KronFactors<'a>; 3],
        permutations: [&'a [i64]; 2],
    ) -> Result<Self, ShapeError> {
        let fail = |what: String| Err(ShapeError(what));
        let n = b2.len();
        let (a, b) = (isqrt(stages[0].a_t.len()), isqrt(stages[0].b.len()));
        if d_model == 0 || n < d_model || a * b != n {
            return fail(format!(
                "width {n} (b2) is not a · b = {a} · {b} (the first stage) ≥ d_model {d_model}"
            ));
        }
        if !cond_v.len().is_multiple_of(d_model) || cond_v.is_empty() {
            return fail(format!(
                "cond_v holds {} values, not [{d_model}, rank]",
                cond_v.len()
            ));
        }
        let rank = cond_v.len() / d_model;
        if cond_u.len() != rank * n {
            return fail(format!(
                "cond_u holds {} values, not [{rank}, {n}]",
                cond_u.len()
            ));
        }
        if let Some(d) = diagonals.iter().position(|d| d.len() != n) {
            return fail(format!(
                "d{} holds {} values, not {n}",
                d + 1,
                diagonals[d].len()
            ));
        }
        if let Some(s) = stages
            .iter()
            .position(|s| s.a_t.len() != a * a || s.b.len() != b * b)
        {
            return fail(format!("stage {} is not [{a}, {a}] and [{b}, {b}]", s + 1));
        }
        for (i, p) in permutations.iter().enumerate() {
            if p.len() != n || p.iter().any(|&j| !(0..n as i64).contains(&j)) {
                return fail(format!("p{} is not {n} indices below {n}", i + 1));
            }
        }
        Ok(MonarchMlp {
            d_model,
            n,
            rank,
            a,
            b,
            cond_v,
            cond_u,
            diagonals,
            b2,
            stages,
            permutations,
        })
    }

    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// The layer's MLP half: `out = x + mlp(norm(x))` `[tokens, d_model]` from `x`
    /// `[tokens, d_model]` and the pre-MLP norm's `gain` `[d_model]` (`norm` as
    /// [`pre_norm_residual`] has it), on `isa`, blocks of tokens spread by `split`.
    pub fn apply(&self, x: &[f32], gain: &[f32], out: &mut [f32], isa: Isa, split: &dyn RowSplit) {
        assert_eq!(gain.len(), self.d_model, "the gain is [d_model]");
        pre_norm_residual(x, gain, out, BLOCK_TOKENS, split, &|normed, tokens, out| {
            self.tokens(normed, tokens, out, isa)
        });
    }

    /// `out` `[tokens, d_model]` = the MLP of `x` `[tokens, d_model]`, on the calling thread,
    /// its loops compiled for `isa`'s vector width ([`Isa::vectorized`]: one value at a time
    /// outside the products otherwise).
    pub fn tokens(&self, x: &[f32], tokens: usize, out: &mut [f32], isa: Isa) {
        isa.vectorized(Tokens {
            mlp: self,
            x,
            tokens,
            out,
            isa,
        })
    }

    #[inline(always)]
    fn tokens_on(&self, x: &[f32], tokens: usize, out: &mut [f32], isa: Isa) {
        let (d, n) = (self.d_model, self.n);
        assert_eq!(x.len(), tokens * d, "x is [tokens, d_model]");
        assert_eq!(out.len(), tokens * d, "out is [tokens, d_model]");
        let [d1, d2, d3, d4] = self.diagonals;
        let [p1, p2] = self.permutations;
        let mut mix = vec![0.0f32; tokens * self.rank];
        matmul(isa, x, self.cond_v, &mut mix, tokens, d, self.rank);
        // A loop: `for_each(softmax)` was compiled on its own for the baseline, where
        // `exp`'s fused steps are calls to `fmaf`.
        for row in mix.chunks_exact_mut(self.rank) {
            softmax(row);
        }
        let mut cond = vec![0.0f32; tokens * n];
        matmul(isa, &mix, self.cond_u, &mut cond, tokens, self.rank, n);
        cond.iter_mut().for_each(|c| *c += 1.0);

        let mut z = vec![0.0f32; tokens * n];
        for (z, x) in z.chunks_exact_mut(n).zip(x.chunks_exact(d)) {
            for ((z, &x), &d1) in z.iter_mut().zip(x).zip(d1) {
                *z = d1 * x;
            }
        }
        let mut scratch = vec![0.0f32; tokens * n];
        self.stage(isa, 0, &mut z, &mut scratch, tokens);
        permute(&z, p1, &mut scratch);
        for (z, cond) in scratch.chunks_exact_mut(n).zip(cond.chunks_exact(n)) {
            for (((z, &cond), &d2), &b2) in z.iter_mut().zip(cond).zip(d2).zip(self.b2) {
                *z = silu(d2 * *z * cond + b2);
            }
        }
        self.stage(isa, 1, &mut scratch, &mut z, tokens);
        permute(&scratch, p2, &mut z);
        for z in z.chunks_exact_mut(n) {
            z.iter_mut().zip(d3).for_each(|(z, &d3)| *z *= d3);
        }
        self.stage(isa, 2, &mut z, &mut scratch, tokens);
        for (out, z) in out.chunks_exact_mut(d).zip(z.chunks_exact(n)) {
            for ((out, &z), &d4) in out.iter_mut().zip(z).zip(d4) {
                *out = d4 * z;
            }
        }
    }

    /// `z ← Aᵀ · Z · B` for every token (`z` `[tokens, n]`), `scratch` as wide as `z`.
    fn stage(&self, isa: Isa, s: usize, z: &mut [f32], scratch: &mut [f32], tokens: usize) {
        let (a, b, factors) = (self.a, self.b, self.stages[s]);
        matmul(isa, z, factors.b, scratch, tokens * a, b, b);
        for (z, zb) in z.chunks_exact_mut(self.n).zip(scratch.chunks_exact(self.n)) {
            matmul(isa, factors.a_t, zb, z, a, a, b);
        }
    }
}

/// [`MonarchMlp::tokens`] as [`Isa::vectorized`] takes it.
struct Tokens<'a> {
    mlp: &'a MonarchMlp<'a>,
    x: &'a [f32],
    tokens: usize,
    out: &'a mut [f32],
    isa: Isa,
}

impl Vectorized for Tokens<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        self.mlp.tokens_on(self.x, self.tokens, self.out, self.isa)
    }
}

/// `out[t, j] = z[t, p[j]]` for every token.
fn permute(z: &[f32], p: &[i64], out: &mut [f32]) {
    let n = p.len();
    for (out, z) in out.chunks_exact_mut(n).zip(z.chunks_exact(n)) {
        for (out, &j) in out.iter_mut().zip(p) {
            *out = z[j as usize];
        }
    }
}

/// `√len` where `len` is a square.
fn isqrt(len: usize) -> usize {
    let root = (len as f64).sqrt().round() as usize;
    if root * root == len {
        root
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::Serial;

    /// A random layer: d_model 12 in n = 4 · 4, rank 3.
    struct Case {
        cond_v: Vec<f32>,
        cond_u: Vec<f32>,
        diagonals: [Vec<f32>; 4],
        b2: Vec<f32>,
        stages: [[Vec<f32>; 2]; 3],
        permutations: [Vec<i64>; 2],
    }

    const D: usize = 12;
    const N: usize = 16;
    const SIDE: usize = 4;
    const RANK: usize = 3;

    impl Case {
        fn new() -> Case {
            let mut seed = 0x9e37_79b9_u32;
            let mut values = |len: usize| -> Vec<f32> {
                (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 17;
                        seed ^= seed << 5;
                        (seed >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0
                    })
                    .collect()
            };
            Case {
                cond_v: values(D * RANK),
                cond_u: values(RANK * N),
                diagonals: std::array::from_fn(|_| values(N)),
                b2: values(N),
                stages: std::array::from_fn(|_| [values(SIDE * SIDE), values(SIDE * SIDE)]),
                permutations: [
                    (0..N as i64).map(|j| (j * 5 + 3) % N as i64).collect(),
                    (0..N as i64).rev().collect(),
                ],
            }
        }

        fn mlp(&self) -> MonarchMlp<'_> {
            let [d1, d2, d3, d4] = &self.diagonals;
            MonarchMlp::new(
                D,
                &self.cond_v,
                &self.cond_u,
                [d1, d2, d3, d4],
                &self.b2,
                std::array::from_fn(|s| KronFactors {
                    a_t: &self.stages[s][0],
                    b: &self.stages[s][1],
                }),
                [&self.permutations[0], &self.permutations[1]],
            )
            .expect("a consistent case")
        }

        /// The formula in f64, each stage as `A[k, i]·Z[k, l]·B[l, j]` summed densely.
        fn dense(&self, x: &[f32]) -> Vec<f64> {
            let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let f = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
            let [d1, d2, d3, d4] = self.diagonals.each_ref().map(|d| f(d));
            let mix: Vec<f64> = (0..RANK)
                .map(|r| {
                    (0..D)
                        .map(|i| x[i] * self.cond_v[i * RANK + r] as f64)
                        .sum()
                })
                .collect();
            let max = mix.iter().copied().fold(f64::MIN, f64::max);
            let total: f64 = mix.iter().map(|m| (m - max).exp()).sum();
            let cond: Vec<f64> = (0..N)
                .map(|j| {
                    1.0 + (0..RANK)
                        .map(|r| (mix[r] - max).exp() / total * self.cond_u[r * N + j] as f64)
                        .sum::<f64>()
                })
                .collect();
            let stage = |s: usize, z: &[f64]| -> Vec<f64> {
                let (a_t, b) = (f(&self.stages[s][0]), f(&self.stages[s][1]));
                let mut out = vec![0.0; N];
                for i in 0..SIDE {
                    for j in 0..SIDE {
                        for k in 0..SIDE {
                            for l in 0..SIDE {
                                out[i * SIDE + j] +=
                                    a_t[i * SIDE + k] * z[k * SIDE + l] * b[l * SIDE + j];
                            }
                        }
                    }
                }
                out
            };
            let permute =
                |z: &[f64], p: &[i64]| p.iter().map(|&j| z[j as usize]).collect::<Vec<_>>();
            let z: Vec<f64> = (0..N)
                .map(|j| if j < D { d1[j] * x[j] } else { 0.0 })
                .collect();
            let z = permute(&stage(0, &z), &self.permutations[0]);
            let z: Vec<f64> = (0..N)
                .map(|j| {
                    let v = d2[j] * z[j] * cond[j] + self.b2[j] as f64;
                    v / (1.0 + (-v).exp())
                })
                .collect();
            let z = permute(&stage(1, &z), &self.permutations[1]);
            let z: Vec<f64> = (0..N).map(|j| d3[j] * z[j]).collect();
            let z = stage(2, &z);
            (0..D).map(|j| d4[j] * z[j]).collect()
        }
    }

    #[test]
    fn every_path_matches_the_formula_and_a_token_gets_its_bits_alone() {
        let case = Case::new();
        let mlp = case.mlp();
        let tokens = BLOCK_TOKENS + 3;
        let x: Vec<f32> = (0..tokens * D).map(|i| (i as f32 * 0.731).sin()).collect();
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; tokens * D];
            mlp.tokens(&x, tokens, &mut out, isa);
            for t in 0..tokens {
                let token = &x[t * D..(t + 1) * D];
                for (j, want) in case.dense(token).into_iter().enumerate() {
                    let got = out[t * D + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1e-2),
                        "{isa:?} token {t} output {j}: {got} vs {want}"
                    );
                }
            }
            // The residual form, a batch against each token alone, bit for bit.
            let gain: Vec<f32> = (0..D).map(|j| 0.9 + j as f32 * 0.01).collect();
            let mut batch = vec![f32::NAN; tokens * D];
            mlp.apply(&x, &gain, &mut batch, isa, &Serial);
            for t in 0..tokens {
                let mut alone = vec![0.0; D];
                mlp.apply(&x[t * D..(t + 1) * D], &gain, &mut alone, isa, &Serial);
                assert_eq!(alone, batch[t * D..(t + 1) * D], "{isa:?} token {t} alone");
            }
        }
    }

    #[test]
    fn inconsistent_tensors_are_refused_with_what_disagrees() {
        let mut case = Case::new();
        case.permutations[1][4] = N as i64;
        let [d1, d2, d3, d4] = &case.diagonals;
        let error = MonarchMlp::new(
            D,
            &case.cond_v,
            &case.cond_u[1..],
            [d1, d2, d3, d4],
            &case.b2,
            std::array::from_fn(|s| KronFactors {
                a_t: &case.stages[s][0],
                b: &case.stages[s][1],
            }),
            [&case.permutations[0], &case.permutations[1]],
        )
        .unwrap_err();
        assert!(error.0.contains("cond_u holds 47 values"), "{error}");
        case.cond_u.truncate(RANK * N);
        let mlp = MonarchMlp::new(
            D,
            &case.cond_v,
            &case.cond_u,
            [d1, d2, d3, d4],
            &case.b2,
            std::array::from_fn(|s| KronFactors {
                a_t: &case.stages[s][0],
                b: &case.stages[s][1],
            }),
            [&case.permutations[0], &case.permutations[1]],
        );
        assert_eq!(mlp.unwrap_err().0, "p2 is not 16 indices below 16");
    }
}
