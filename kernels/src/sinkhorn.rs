//! `needle.Sinkhorn`: the hyper-connections' residual mix `h_res = Sinkhorn(logits)`
//! (upstream `_ScanBody`): `iterations` alternating log-domain normalisations of each
//! `[n, n]` matrix, rows then columns (`x ← x − logsumexp(x)` along the axis), then `exp`.
//!
//! Input `logits` float32 `[…, n, n]`, attribute `iterations`; output float32, same shape.
//! The op replaces the stock graph's `2 · iterations` LogSoftmax nodes and its Exp with one
//! kernel: the matrices are tiny (n = the lanes, 3 or 4), and launching 41 nodes a layer
//! cost more than their arithmetic.
//!
//! The same recurrence runs in the linear domain where it is safe: `K = exp(x − max)` once,
//! then each row (column) times the inverse of its sum, which is `exp` of the log-domain
//! step (`x − logsumexp(x)`) with no `exp` or `ln` in the loop (those were ~2% of a Needle 2
//! prompt's time). It is safe where the matrix's logits are finite and span at most
//! [`LINEAR_RANGE`]: every scaling then stays within `e^±2·32`, far from f32's subnormals
//! (`e^−87`), where the log domain's precision is matched (both within ~4e-7 of the f64
//! recurrence). Other matrices take the log-domain form, written as onnxruntime's
//! `LogSoftmax` computes it (`(x − max) − ln Σ exp(x − max)`).

use crate::isa::Isa;
use crate::math::{exp, ln};

/// Matrices from which a call takes the AVX-512 path of a matrix in each lane: below it,
/// one matrix at a time (the same bits) costs less than whole registers of lanes.
const VECTOR_FROM: usize = 4;

/// The widest span of a matrix's logits (largest − smallest) that the linear form takes.
pub(crate) const LINEAR_RANGE: f32 = 32.0;

/// `out = Sinkhorn(logits)` for every `[n, n]` matrix of `logits`. On AVX-512, several
/// matrices side by side, one in each lane ([`avx512::sinkhorn`]: a prompt's tokens each
/// have one); fewer, each matrix whole in one register when it fits
/// ([`avx512::sinkhorn_in_register`]: a decode step's one token). Every path chooses the
/// form by the matrix alone and does the same arithmetic in the same order (`exp` and `ln`
/// are plain arithmetic, never fused), so a matrix gets the same bits alone or among
/// others, on any path.
pub fn sinkhorn(isa: Isa, logits: &[f32], n: usize, iterations: usize, out: &mut [f32]) {
    assert!(
        n > 0 && logits.len().is_multiple_of(n * n),
        "logits are [.., n, n]"
    );
    assert_eq!(out.len(), logits.len(), "out is shaped like logits");
    if iterations == 0 {
        // No step: `exp` alone (the linear form's shift by the maximum would stay in).
        out.iter_mut().zip(logits).for_each(|(o, &l)| *o = exp(l));
        return;
    }
    out.copy_from_slice(logits);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && logits.len() / (n * n) >= VECTOR_FROM {
        // Sound: `Isa::available` offers AVX-512 only where AVX-512F was detected.
        return unsafe { avx512::sinkhorn(out, n, iterations) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && n * n <= avx512::LANES {
        for matrix in out.chunks_exact_mut(n * n) {
            // Sound: as above.
            unsafe { avx512::sinkhorn_in_register(matrix, n, iterations) };
        }
        return;
    }
    let _ = isa;
    for matrix in out.chunks_exact_mut(n * n) {
        match linear_max(matrix) {
            Some(max) => {
                matrix.iter_mut().for_each(|v| *v = exp(*v - max));
                alternate(matrix, n, iterations, scale_to_one);
            }
            None => {
                alternate(matrix, n, iterations, log_normalize);
                matrix.iter_mut().for_each(|v| *v = exp(*v));
            }
        }
    }
}

/// `iterations` steps of `matrix`: each row, then each column, by `normalize` (given a
/// line's first element, stride and length; a function item, so the step is inlined).
fn alternate(
    matrix: &mut [f32],
    n: usize,
    iterations: usize,
    normalize: impl Fn(&mut [f32], usize, usize, usize),
) {
    for _ in 0..iterations {
        for r in 0..n {
            normalize(matrix, r * n, 1, n);
        }
        for c in 0..n {
            normalize(matrix, c, n, n);
        }
    }
}

/// The largest logit where `matrix` takes the linear form: all finite, spanning at most
/// [`LINEAR_RANGE`].
fn linear_max(matrix: &[f32]) -> Option<f32> {
    let finite = matrix.iter().all(|v| v.is_finite());
    let max = matrix.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = matrix.iter().copied().fold(f32::INFINITY, f32::min);
    (finite && max - min <= LINEAR_RANGE).then_some(max)
}

/// `x ← x · (1 / Σ x)` over the `len` elements `start, start + stride, …` (the sum from 0,
/// in order).
fn scale_to_one(m: &mut [f32], start: usize, stride: usize, len: usize) {
    let at = |i: usize| start + i * stride;
    let sum = (0..len).fold(0.0f32, |sum, i| sum + m[at(i)]);
    let inverse = 1.0 / sum;
    for i in 0..len {
        m[at(i)] *= inverse;
    }
}

/// `x ← (x − max) − ln Σ exp(x − max)` (as onnxruntime's `LogSoftmax` writes it) over the
/// `len` elements `start, start + stride, …`.
fn log_normalize(m: &mut [f32], start: usize, stride: usize, len: usize) {
    let at = |i: usize| start + i * stride;
    let max = (0..len).map(|i| m[at(i)]).fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = (0..len).map(|i| exp(m[at(i)] - max)).sum();
    // The largest term is exp(0) = 1: the sum is a normal number ≥ 1.
    let log_sum = ln(sum);
    for i in 0..len {
        m[at(i)] = (m[at(i)] - max) - log_sum;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use crate::math::{
        EXP_HIGHEST, EXP_LOWEST, EXP_POLYNOMIAL, LN2_HIGH, LN2_LOW, LN_POLYNOMIAL, ROUND,
    };
    use std::arch::x86_64::*;

    /// Matrices side by side, one in each lane of a register.
    pub const LANES: usize = 16;
    /// Lane groups whose normalisations interleave: each half-step is a chain of dependent
    /// `exp`, sum and `ln`, so one group alone waits on their latency.
    const GROUPS: usize = 4;

    /// [`super::sinkhorn`] of the matrices of `m` in place, `LANES · GROUPS` at a time
    /// (lanes without a matrix hold zeros, which normalise like any other). Every lane runs
    /// the linear form; where some lane's matrix needs the log domain, its group also runs
    /// that, and each lane keeps its own form's result.
    #[target_feature(enable = "avx512f")]
    pub fn sinkhorn(m: &mut [f32], n: usize, iterations: usize) {
        let size = n * n;
        let mut v = vec![_mm512_setzero_ps(); size * GROUPS];
        let mut logs = Vec::new();
        let mut lanes = [0.0f32; LANES];
        for chunk in m.chunks_mut(size * LANES * GROUPS) {
            let groups = (chunk.len() / size).div_ceil(LANES);
            let v = &mut v[..groups * size];
            // Element e of group g: lane i holds matrix g · LANES + i's.
            let matrices = |g: usize, i: usize| (g * LANES + i) * size;
            for (j, v) in v.iter_mut().enumerate() {
                let (g, e) = (j / size, j % size);
                for (i, lane) in lanes.iter_mut().enumerate() {
                    *lane = chunk.get(matrices(g, i) + e).copied().unwrap_or(0.0);
                }
                // Sound: `lanes` holds 16 floats.
                *v = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
            }
            let mut linear = [(0 as __mmask16, _mm512_setzero_ps()); GROUPS];
            for (linear, group) in linear.iter_mut().zip(v.chunks_exact(size)) {
                *linear = linear_lanes(group);
            }
            let all_linear = linear[..groups].iter().all(|&(l, _)| l == __mmask16::MAX);
            if !all_linear {
                logs.clear();
                logs.extend_from_slice(v);
            }
            for (group, &(_, max)) in v.chunks_exact_mut(size).zip(&linear) {
                group
                    .iter_mut()
                    .for_each(|x| *x = exp(_mm512_sub_ps(*x, max)));
            }
            alternate(v, n, iterations, Form::Linear);
            if !all_linear {
                alternate(&mut logs, n, iterations, Form::Log);
                for (j, (v, &log)) in v.iter_mut().zip(logs.iter()).enumerate() {
                    *v = _mm512_mask_blend_ps(linear[j / size].0, exp(log), *v);
                }
            }
            for (j, v) in v.iter().enumerate() {
                let (g, e) = (j / size, j % size);
                // Sound: `lanes` holds 16 floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
                for (i, &lane) in lanes.iter().enumerate() {
                    if let Some(out) = chunk.get_mut(matrices(g, i) + e) {
                        *out = lane;
                    }
                }
            }
        }
    }

    /// How a matrix's lines are normalised.
    #[derive(Clone, Copy)]
    enum Form {
        /// [`scale_to_one`].
        Linear,
        /// [`log_normalize`].
        Log,
    }

    /// `iterations` steps of every group's matrices in `form`: rows, then columns (the
    /// groups side by side, so that their chains of dependent steps interleave).
    #[target_feature(enable = "avx512f")]
    fn alternate(v: &mut [__m512], n: usize, iterations: usize, form: Form) {
        let rows = (0..n).map(|r| (r * n, 1));
        let columns = (0..n).map(|c| (c, n));
        for _ in 0..iterations {
            for (start, stride) in rows.clone().chain(columns.clone()) {
                for group in v.chunks_exact_mut(n * n) {
                    match form {
                        Form::Linear => scale_to_one(group, start, stride, n),
                        Form::Log => log_normalize(group, start, stride, n),
                    }
                }
            }
        }
    }

    /// The lanes whose matrix ([`super::linear_max`]'s test, a matrix a lane) takes the
    /// linear form, and each lane's largest logit.
    #[target_feature(enable = "avx512f")]
    fn linear_lanes(group: &[__m512]) -> (__mmask16, __m512) {
        let (mut max, mut min) = (
            _mm512_set1_ps(f32::NEG_INFINITY),
            _mm512_set1_ps(f32::INFINITY),
        );
        let mut finite = __mmask16::MAX;
        for &x in group {
            // x − x is 0 for a finite x, NaN for ±∞ and NaN.
            let zero = _mm512_sub_ps(x, x);
            finite &= _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(zero, _mm512_setzero_ps());
            max = _mm512_max_ps(max, x);
            min = _mm512_min_ps(min, x);
        }
        let span = _mm512_sub_ps(max, min);
        let range = _mm512_set1_ps(super::LINEAR_RANGE);
        (finite & _mm512_cmp_ps_mask::<_CMP_LE_OQ>(span, range), max)
    }

    /// [`super::scale_to_one`] in all 16 lanes.
    #[target_feature(enable = "avx512f")]
    fn scale_to_one(m: &mut [__m512], start: usize, stride: usize, len: usize) {
        let at = |i: usize| start + i * stride;
        let mut sum = _mm512_setzero_ps();
        for i in 0..len {
            sum = _mm512_add_ps(sum, m[at(i)]);
        }
        let inverse = _mm512_div_ps(_mm512_set1_ps(1.0), sum);
        for i in 0..len {
            m[at(i)] = _mm512_mul_ps(m[at(i)], inverse);
        }
    }

    /// [`super::sinkhorn`] of one `[n, n]` matrix that fits a register (`n² ≤ 16`), element
    /// `(r, c)` in lane `r · n + c`: every row (then every column) normalised at once, each
    /// lane reading its row's (column's) elements through permutes in the scalar order.
    #[target_feature(enable = "avx512f")]
    pub fn sinkhorn_in_register(m: &mut [f32], n: usize, iterations: usize) {
        let size = n * n;
        assert!(
            size <= LANES && m.len() == size,
            "one matrix of at most 16 elements"
        );
        // `picks(element)[k]`: lane (r, c) reads element(r, c, k); lanes past the matrix
        // read themselves (they hold zeros, which normalise harmlessly).
        let picks = |element: fn(usize, usize, usize, usize) -> usize| -> [__m512i; 4] {
            std::array::from_fn(|k| {
                let lanes: [i32; LANES] = std::array::from_fn(|l| match l < size {
                    true => element(n, l / n, l % n, k.min(n - 1)) as i32,
                    false => l as i32,
                });
                // Sound: `lanes` holds 16 ints.
                unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
            })
        };
        // The k-th element of the lane's row, of its column.
        let rows = picks(|n, r, _, k| r * n + k);
        let columns = picks(|n, _, c, k| k * n + c);
        let mask: __mmask16 = ((1u32 << size) - 1) as __mmask16;
        let linear = super::linear_max(m);
        // Sound: the masked lanes are `m`'s `size` floats.
        let mut v = unsafe { _mm512_maskz_loadu_ps(mask, m.as_ptr()) };
        match linear {
            Some(max) => {
                v = exp(_mm512_sub_ps(v, _mm512_set1_ps(max)));
                for _ in 0..iterations {
                    v = scale_picked(v, &rows[..n]);
                    v = scale_picked(v, &columns[..n]);
                }
            }
            None => {
                for _ in 0..iterations {
                    v = normalize_picked(v, &rows[..n]);
                    v = normalize_picked(v, &columns[..n]);
                }
                v = exp(v);
            }
        }
        // Sound: as the load.
        unsafe { _mm512_mask_storeu_ps(m.as_mut_ptr(), mask, v) };
    }

    /// [`super::scale_to_one`] of every lane over the elements `picks` give it, in order.
    #[target_feature(enable = "avx512f")]
    fn scale_picked(v: __m512, picks: &[__m512i]) -> __m512 {
        let mut sum = _mm512_setzero_ps();
        for &pick in picks {
            sum = _mm512_add_ps(sum, _mm512_permutexvar_ps(pick, v));
        }
        _mm512_mul_ps(v, _mm512_div_ps(_mm512_set1_ps(1.0), sum))
    }

    /// [`super::log_normalize`] of every lane over the elements `picks` give it, in order.
    #[target_feature(enable = "avx512f")]
    fn normalize_picked(v: __m512, picks: &[__m512i]) -> __m512 {
        let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
        for &pick in picks {
            max = _mm512_max_ps(max, _mm512_permutexvar_ps(pick, v));
        }
        let e = exp(_mm512_sub_ps(v, max));
        let mut sum = _mm512_setzero_ps();
        for &pick in picks {
            sum = _mm512_add_ps(sum, _mm512_permutexvar_ps(pick, e));
        }
        _mm512_sub_ps(_mm512_sub_ps(v, max), ln(sum))
    }

    /// [`super::log_normalize`] in all 16 lanes.
    #[target_feature(enable = "avx512f")]
    pub fn log_normalize(m: &mut [__m512], start: usize, stride: usize, len: usize) {
        let at = |i: usize| start + i * stride;
        let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in 0..len {
            max = _mm512_max_ps(max, m[at(i)]);
        }
        let mut sum = _mm512_setzero_ps();
        for i in 0..len {
            sum = _mm512_add_ps(sum, exp(_mm512_sub_ps(m[at(i)], max)));
        }
        let log_sum = ln(sum);
        for i in 0..len {
            m[at(i)] = _mm512_sub_ps(_mm512_sub_ps(m[at(i)], max), log_sum);
        }
    }

    /// `crate::math::exp`, lane by lane.
    #[target_feature(enable = "avx512f")]
    pub fn exp(x: __m512) -> __m512 {
        let c = _mm512_set1_ps;
        let (mul, add, sub) = (_mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps);
        let x = _mm512_min_ps(_mm512_max_ps(x, c(EXP_LOWEST)), c(EXP_HIGHEST));
        let round = c(ROUND);
        let k = sub(
            _mm512_fmadd_ps(x, c(std::f32::consts::LOG2_E), round),
            round,
        );
        let r = _mm512_fnmadd_ps(k, c(LN2_LOW), _mm512_fnmadd_ps(k, c(LN2_HIGH), x));
        let mut p = c(EXP_POLYNOMIAL[0]);
        for &coefficient in &EXP_POLYNOMIAL[1..] {
            p = _mm512_fmadd_ps(p, r, c(coefficient));
        }
        let e = add(_mm512_fmadd_ps(mul(p, r), r, r), c(1.0));
        let two_k = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvttps_epi32(k),
            _mm512_set1_epi32(127),
        ));
        mul(e, _mm512_castsi512_ps(two_k))
    }

    /// `crate::math::ln`, lane by lane.
    #[target_feature(enable = "avx512f")]
    pub fn ln(x: __m512) -> __m512 {
        let c = _mm512_set1_ps;
        let (mul, add, sub) = (_mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps);
        let bits = _mm512_castps_si512(x);
        let e = _mm512_sub_epi32(
            _mm512_and_si512(_mm512_srli_epi32::<23>(bits), _mm512_set1_epi32(0xff)),
            _mm512_set1_epi32(126),
        );
        let mantissa = _mm512_and_si512(bits, _mm512_set1_epi32(0x007f_ffff));
        let m = _mm512_castsi512_ps(_mm512_or_si512(mantissa, _mm512_set1_epi32(0x3f00_0000)));
        let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(m, c(std::f32::consts::FRAC_1_SQRT_2));
        let e = _mm512_mask_sub_epi32(e, small, e, _mm512_set1_epi32(1));
        let e = _mm512_cvtepi32_ps(e);
        let f = _mm512_mask_blend_ps(small, sub(m, c(1.0)), sub(add(m, m), c(1.0)));
        let z = mul(f, f);
        let mut p = c(LN_POLYNOMIAL[0]);
        for &coefficient in &LN_POLYNOMIAL[1..] {
            p = add(mul(p, f), c(coefficient));
        }
        let y = sub(add(mul(f, mul(z, p)), mul(c(LN2_LOW), e)), mul(c(0.5), z));
        add(add(f, y), mul(c(LN2_HIGH), e))
    }
}

#[cfg(test)]
mod tests {
    /// Upstream's recurrence in f64: `log_k − logsumexp(log_k)` along rows, then columns.
    fn reference(logits: &[f32], n: usize, iterations: usize) -> Vec<f64> {
        let mut k: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
        let lse = |v: &[f64]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
        for _ in 0..iterations {
            for r in 0..n {
                let l = lse(&k[r * n..(r + 1) * n]);
                k[r * n..(r + 1) * n].iter_mut().for_each(|x| *x -= l);
            }
            for c in 0..n {
                let column: Vec<f64> = (0..n).map(|r| k[r * n + c]).collect();
                let l = lse(&column);
                (0..n).for_each(|r| k[r * n + c] -= l);
            }
        }
        k.iter().map(|x| x.exp()).collect()
    }

    /// Logits of `count` matrices, spanning about `1.25 · spread`: every third matrix four
    /// times as wide where `wide` is set.
    fn logits(count: usize, n: usize, spread: f32, wide: bool) -> Vec<f32> {
        (0..count * n * n)
            .map(|i| {
                let v = ((i * 7919) % 29) as f32 / 28.0 * 1.25 * spread - 0.6 * spread;
                match wide && (i / (n * n)) % 3 == 1 {
                    true => 4.0 * v,
                    false => v,
                }
            })
            .collect()
    }

    /// Both forms against the recurrence in f64: spans under [`super::LINEAR_RANGE`] (the
    /// linear form), and spans of up to 100 (the log domain).
    #[test]
    fn matches_upstreams_recurrence_and_is_doubly_stochastic() {
        for (n, spread) in [(3, 20.0), (4, 20.0), (3, 80.0), (4, 80.0), (4, 0.5)] {
            let logits = logits(2, n, spread, false);
            let mut out = vec![0.0; logits.len()];
            super::sinkhorn(crate::Isa::best(), &logits, n, 20, &mut out);
            for (m, matrix) in out.chunks_exact(n * n).enumerate() {
                let want = reference(&logits[m * n * n..(m + 1) * n * n], n, 20);
                for (got, want) in matrix.iter().zip(&want) {
                    let error = (*got as f64 - want).abs();
                    assert!(error < 1e-6, "n={n} spread {spread}: {got} vs {want}");
                }
                for c in 0..n {
                    let column: f32 = (0..n).map(|r| matrix[r * n + c]).sum();
                    assert!((column - 1.0).abs() < 1e-5, "column {c} sums to {column}");
                }
            }
        }
    }

    /// A matrix gets the same bits alone, in any lane of a group, and on every path, in
    /// either form and beside matrices of the other.
    #[test]
    fn every_matrix_gets_its_bits_alone_in_any_lane_on_every_path() {
        for n in [3, 4] {
            bits_alone_in_any_lane_on_every_path(n);
        }
    }

    fn bits_alone_in_any_lane_on_every_path(n: usize) {
        let logits = logits(37, n, 20.0, true);
        let run = |isa, logits: &[f32]| {
            let mut out = vec![f32::NAN; logits.len()];
            super::sinkhorn(isa, logits, n, 20, &mut out);
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let all = run(crate::Isa::Scalar, &logits);
        for isa in crate::Isa::available() {
            assert_eq!(run(isa, &logits), all, "{isa:?}");
            for (m, matrix) in logits.chunks_exact(n * n).enumerate() {
                assert_eq!(
                    run(isa, matrix),
                    all[m * n * n..(m + 1) * n * n],
                    "{isa:?} {m}"
                );
            }
        }
    }
}
