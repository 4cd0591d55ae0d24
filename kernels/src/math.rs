//! Elementwise functions written branch-free so that the compiler vectorizes the loops
//! that call them (`f32::exp` is a libm call per element, too slow for a prompt's worth of
//! activations), and the row normalisation several ops apply to their input.

use crate::isa::Isa;

/// `eˣ` within 2 ulp over the float range (Cephes' `expf`: `x = k·ln 2 + r`, a degree-6
/// polynomial in `r`, times `2ᵏ` built in the exponent bits); the value at −87.3 below it,
/// and ∞ from about 88.4 on (where `2ᵏ` overflows), which `σ` and SiLU read correctly.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `k · LN2_HIGH` is exact for the k that occur.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2²³ rounds to the nearest integer without `roundps`.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let k = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - k * LN2_HIGH) - k * LN2_LOW;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = (p * r * r + r) + 1.0;
    e * f32::from_bits(((k as i32 + 127) << 23) as u32)
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

/// The ε every Needle RMS norm adds to the mean square.
pub const RMS_EPSILON: f32 = 1e-6;

/// `√(mean v² + ε)`, the squares summed in order.
pub fn root_mean_square(v: &[f32]) -> f32 {
    let mean = v.iter().map(|v| v * v).sum::<f32>() / v.len() as f32;
    (mean + RMS_EPSILON).sqrt()
}

/// `v ← softmax(v)`, the maximum subtracted first (−∞ entries get ~0: [`exp`] clamps).
pub fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    v.iter_mut().for_each(|v| *v = exp(*v - max));
    let sum: f32 = v.iter().sum();
    v.iter_mut().for_each(|v| *v /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

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
