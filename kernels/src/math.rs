//! Elementwise functions written branch-free so that the compiler vectorizes the loops
//! that call them (`f32::exp` is a libm call per element, too slow for a prompt's worth of
//! activations), and the row normalisation several ops apply to their input.

use crate::isa::Isa;

/// `eˣ` within 2 ulp over the float range (Cephes' `expf`: `x = k·ln 2 + r`, a degree-6
/// polynomial in `r`, times `2ᵏ` built in the exponent bits); the value at −87.3 below it,
/// and ∞ from about 88.4 on (where `2ᵏ` overflows), which `σ` and SiLU read correctly.
/// Its steps are fused multiply-adds (`mul_add`, one rounding each): on the SIMD paths one
/// instruction where a multiply and an add were two (a prompt's softmaxes and gates are
/// bound by `exp`), on the scalar path libm's `fmaf`, which rounds the same way, so every
/// path keeps the same bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_LOWEST, EXP_HIGHEST);
    let shifted = x.mul_add(std::f32::consts::LOG2_E, ROUND);
    let k = shifted - ROUND;
    let r = (-k).mul_add(LN2_LOW, (-k).mul_add(LN2_HIGH, x));
    let mut p = EXP_POLYNOMIAL[0];
    for &coefficient in &EXP_POLYNOMIAL[1..] {
        p = p.mul_add(r, coefficient);
    }
    let e = (p * r).mul_add(r, r) + 1.0;
    // `shifted` lies in [2²³, 2²⁴), where floats are the integers: its bits are ROUND's
    // plus `k`. Integer arithmetic on them gives `k` without `k as i32`, whose saturating
    // conversion compiles to a compare and a select a lane and kept loops over `exp` from
    // vectorizing.
    let k_bits = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    e * f32::from_bits(((k_bits + 127) << 23) as u32)
}

/// `x · σ(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `Σ a·b` on `isa`, in sixteen interleaved partial sums (two AVX registers' worth), which
/// the compiler vectorizes where one running sum would wait on each add; the SIMD paths
/// fuse each multiply-add.
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "a dot product of equal lengths");
    match isa {
        Isa::Scalar => lanes::<false>(a, b),
        #[cfg(target_arch = "x86_64")]
        // Sound: `Isa::available` offers the x86 paths only where AVX2 and FMA were detected.
        Isa::Avx2 | Isa::Avx512 => unsafe { fused_lanes(a, b) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 path off x86-64"),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fused_lanes(a: &[f32], b: &[f32]) -> f32 {
    lanes::<true>(a, b)
}

#[inline(always)]
fn lanes<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut sums = [0.0f32; LANES];
    let (a16, b16) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a16
        .remainder()
        .iter()
        .zip(b16.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (a, b) in a16.zip(b16) {
        for ((sum, &x), &y) in sums.iter_mut().zip(a).zip(b) {
            *sum = if FUSED {
                x.mul_add(y, *sum)
            } else {
                x * y + *sum
            };
        }
    }
    sums.iter().sum::<f32>() + tail
}

/// ln 2 split so that `k · LN2_HIGH` is exact for the `k` that occur ([`exp`], [`ln`]).
pub(crate) const LN2_HIGH: f32 = 0.693_359_4;
pub(crate) const LN2_LOW: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5 · 2²³ rounds to the nearest integer without `roundps`.
pub(crate) const ROUND: f32 = 12_582_912.0;
/// The range [`exp`] clamps its argument to.
pub(crate) const EXP_LOWEST: f32 = -87.3;
pub(crate) const EXP_HIGHEST: f32 = 88.7;

/// [`ln`]'s polynomial in `m − 1`, highest power first (Cephes' `logf`).
pub(crate) const LN_POLYNOMIAL: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_5e-1,
    -2.499_999_4e-1,
    0.333_333_3,
];

/// [`exp`]'s polynomial in `r`, highest power first (Cephes' `expf`).
pub(crate) const EXP_POLYNOMIAL: [f32; 6] = [
    1.987_569_2e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `ln x` for a positive normal `x`, within 2 ulp (Cephes' `logf`: `x = m · 2ᵉ` with `m`
/// in [√½, √2), a degree-8 polynomial in `m − 1`), branch-free so that loops over it
/// vectorize.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    let bits = x.to_bits();
    // x = m · 2ᵉ with m in [½, 1).
    let e = ((bits >> 23) & 0xff) as i32 - 126;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let small = m < SQRT_HALF;
    let e = (e - i32::from(small)) as f32;
    let f = if small { m + m - 1.0 } else { m - 1.0 };
    let z = f * f;
    let mut p = LN_POLYNOMIAL[0];
    for &coefficient in &LN_POLYNOMIAL[1..] {
        p = p * f + coefficient;
    }
    let y = f * (z * p) + LN2_LOW * e - 0.5 * z;
    (f + y) + LN2_HIGH * e
}

/// The ε every Needle RMS norm adds to the mean square.
pub const RMS_EPSILON: f32 = 1e-6;

/// `√(mean v² + ε)`, the squares summed in sixteen interleaved partial sums ([`sum`]): one
/// running sum waited on each add (a 2048-wide hyper-connection stream's was a tenth of a
/// Needle 2 prefill's stream update).
#[inline(always)]
pub fn root_mean_square(v: &[f32]) -> f32 {
    let mean = lanes::<false>(v, v) / v.len() as f32;
    (mean + RMS_EPSILON).sqrt()
}

/// `1 / √(mean v² + ε)`: normalising rows multiply by it, since a division a value (a
/// `vdivps` is ~16 cycles a register on the cores measured) was most of a norm's time.
#[inline(always)]
pub fn inverse_root_mean_square(v: &[f32]) -> f32 {
    1.0 / root_mean_square(v)
}

/// `Σ v` in sixteen interleaved partial sums, then those in order: the form that
/// vectorizes (a fixed order, so the same bits on every path).
#[inline(always)]
pub fn sum(v: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut sums = [0.0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        sums.iter_mut().zip(chunk).for_each(|(s, &x)| *s += x);
    }
    sums.iter().sum::<f32>() + tail
}

/// The largest of `v` (−∞ when empty; NaNs skipped), sixteen lanes at a time: a maximum
/// does not depend on the order it is taken in, and one running maximum waited on each
/// compare.
#[inline(always)]
pub fn max(v: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| larger(m, x));
    for chunk in chunks {
        maxima
            .iter_mut()
            .zip(chunk)
            .for_each(|(m, &x)| *m = larger(*m, x));
    }
    maxima.iter().fold(tail, |m, &x| larger(m, x))
}

/// `x` where it is larger than `m`, else `m` (`m` never NaN): `f32::max`'s value, as one
/// `maxps` (`f32::max` also handles a NaN `m`, three instructions a register).
#[inline(always)]
fn larger(m: f32, x: f32) -> f32 {
    if x > m {
        x
    } else {
        m
    }
}

/// `v ← softmax(v)`, the maximum subtracted first (−∞ entries get ~0: [`exp`] clamps).
/// Inlined, so that a caller compiled for a wider instruction set vectorizes it as wide.
#[inline(always)]
pub fn softmax(v: &mut [f32]) {
    let inverse = exponentials(v);
    v.iter_mut().for_each(|v| *v *= inverse);
}

/// `v ← exp(v − max v)`, returning the inverse of their sum: [`softmax`] but for its last
/// pass, for callers that scale later what they make of `v` (attention scales a head's
/// 64 sums where the row has 256 weights).
#[inline(always)]
pub fn exponentials(v: &mut [f32]) -> f32 {
    let max = max(v);
    // The exponentials summed as they are written ([`sum`]'s sixteen lanes and order, so
    // the same bits as summing them after): one pass over the row fewer.
    const LANES: usize = 16;
    let mut sums = [0.0f32; LANES];
    let mut chunks = v.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        let chunk: &mut [f32; LANES] = chunk.try_into().expect("chunks of 16");
        for v in chunk.iter_mut() {
            *v = exp(*v - max);
        }
        for (s, &v) in sums.iter_mut().zip(chunk.iter()) {
            *s += v;
        }
    }
    let tail = chunks.into_remainder();
    tail.iter_mut().for_each(|v| *v = exp(*v - max));
    let tail: f32 = tail.iter().sum();
    // The sum's inverse, to multiply by: a division a value held the softmax back.
    1.0 / (sums.iter().sum::<f32>() + tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_is_within_2_ulp_of_libm() {
        let mut x = 1.0e-30f32;
        while x < 1.0e30 {
            let (got, want) = (ln(x), x.ln());
            let ulp = want.to_bits().abs_diff(got.to_bits());
            assert!(
                ulp <= 2 || (got - want).abs() < 1e-7,
                "ln({x}) = {got}, libm {want}"
            );
            x *= 1.000_37;
        }
    }

    #[test]
    fn exp_is_within_2_ulp_of_libm() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            let ulp = want.to_bits().abs_diff(got.to_bits());
            assert!(ulp <= 2, "exp({x}) = {got}, libm {want}");
            x += 0.0137;
        }
        assert_eq!(exp(-200.0), exp(-87.3));
        assert!(exp(-200.0) < 1e-37);
    }

    #[test]
    fn silu_saturates_without_nan() {
        assert_eq!(silu(-1e30), 0.0);
        assert_eq!(silu(1e30), 1e30);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
    }

    #[test]
    fn dot_sums_every_product() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.3).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        for isa in Isa::available() {
            let got = dot(isa, &a, &b) as f64;
            assert!((got - want).abs() < 1e-5, "{isa:?}: {got} vs {want}");
        }
    }
}
