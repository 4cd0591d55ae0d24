//! IEEE half → single conversion of the CQ group norms, exact.

/// `bits` (an IEEE half) as float32, exactly.
pub(crate) fn to_f32(bits: u16) -> f32 {
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
    fn known_halves() {
        for (bits, value) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x0001, 5.960_464_5e-8),
            (0x7bff, 65504.0),
            (0x0000, 0.0),
        ] {
            assert_eq!(super::to_f32(bits), value, "{bits:#06x}");
        }
    }
}
