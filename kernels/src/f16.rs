//! IEEE half → single conversion, exact: the CQ group norms (here and in the `.cact` reader).

use crate::isa::Isa;

/// `bits` (an IEEE half) as float32, exactly.
pub fn to_f32(bits: u16) -> f32 {
    let sign = ((bits as u32) & 0x8000) << 16;
    let exp = ((bits >> 10) & 0x1f) as u32;
    let mant = (bits & 0x3ff) as u32;
    let out = match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            let shift = mant.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((mant << shift) & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (mant << 13),
        _ => sign | ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(out)
}

/// Every half of `src` as float32 into `dst`, exactly: 8 at a time by the F16C
/// instruction where `isa` has it (a product's group norms, converted per row block, cost
/// as much as a sixth of a one-token CQ product one at a time).
pub fn widen(isa: Isa, src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "one float a half");
    match isa {
        Isa::Scalar => dst.iter_mut().zip(src).for_each(|(d, &h)| *d = to_f32(h)),
        #[cfg(target_arch = "x86_64")]
        // Sound: `Isa::available` offers the x86 paths only where F16C was detected.
        Isa::Avx2 | Isa::Avx512 => unsafe { widen_f16c(src, dst) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no x86 path off x86-64"),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let whole = src.len() / 8 * 8;
    let (dst8, dst_tail) = dst.split_at_mut(whole);
    for (h, f) in src.chunks_exact(8).zip(dst8.chunks_exact_mut(8)) {
        // Sound: both chunks hold 8 elements.
        let halves = _mm_loadu_si128(h.as_ptr().cast());
        _mm256_storeu_ps(f.as_mut_ptr(), _mm256_cvtph_ps(halves));
    }
    let tail = src[whole..].iter();
    dst_tail
        .iter_mut()
        .zip(tail)
        .for_each(|(d, &h)| *d = to_f32(h));
}

#[cfg(test)]
mod tests {
    #[test]
    fn special_values() {
        for (h, f) in [
            (0x0000, 0.0),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x7bff, 65504.0),
            (0x0001, 2f32.powi(-24)),
            (0x03ff, 1023.0 * 2f32.powi(-24)),
            (0x0400, 2f32.powi(-14)),
            (0x3555, 0.333_251_95),
        ] {
            assert_eq!(super::to_f32(h), f, "{h:#06x}");
        }
        assert_eq!(super::to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(super::to_f32(0x7c00), f32::INFINITY);
        assert_eq!(super::to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(super::to_f32(0x7e00).is_nan());
    }

    /// Every half, widened on every path, is `to_f32`'s float (NaNs as NaNs).
    #[test]
    fn every_path_widens_every_half_exactly() {
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let want: Vec<f32> = halves.iter().map(|&h| super::to_f32(h)).collect();
        for isa in crate::Isa::available() {
            let mut got = vec![0.0f32; halves.len() - 3];
            super::widen(isa, &halves[3..], &mut got);
            for (h, (g, w)) in halves[3..].iter().zip(got.iter().zip(&want[3..])) {
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                assert!(same, "{isa:?} {h:#06x}: {g} vs {w}");
            }
        }
    }
}
