//! IEEE half → single conversion, exact: the CQ group norms (here and in the `.cact` reader).

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
}
