//! The reference path: each code unpacked from its row's bitstream, any width.

/// The dots of `R` rows (`codes`, f32 `norms` per group) with one rotated token `xt`
/// (natural order), summed per group, then `Σ_g norm · group sum` in group order.
pub(super) fn dots<const R: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    bits: usize,
    codebook: &[f32],
) -> [f32; R] {
    std::array::from_fn(|j| {
        let mut sum = 0.0f32;
        for (g, (x, norm)) in xt.chunks_exact(group).zip(norms[j]).enumerate() {
            let mut group_sum = 0.0f32;
            for (k, x) in x.iter().enumerate() {
                group_sum += codebook[code(codes[j], g * group + k, bits)] * x;
            }
            sum += norm * group_sum;
        }
        sum
    })
}

/// One row's codebook values in natural order, `out[k] = codebook[code k]`.
pub(super) fn decode(codes: &[u8], bits: usize, codebook: &[f32], out: &mut [f32]) {
    for (k, value) in out.iter_mut().enumerate() {
        *value = codebook[code(codes, k, bits)];
    }
}

/// [`dots`] of `R` decoded rows ([`decode`]) with `T` tokens: the same products summed in
/// the same order, so the same bits.
pub(super) fn decoded_dots<const R: usize, const T: usize>(
    values: [&[f32]; R],
    norms: [&[f32]; R],
    xts: [&[f32]; T],
    group: usize,
) -> [[f32; R]; T] {
    std::array::from_fn(|t| {
        std::array::from_fn(|j| {
            let mut sum = 0.0f32;
            let groups = xts[t]
                .chunks_exact(group)
                .zip(values[j].chunks_exact(group));
            for ((x, v), norm) in groups.zip(norms[j]) {
                let mut group_sum = 0.0f32;
                for (x, v) in x.iter().zip(v) {
                    group_sum += v * x;
                }
                sum += norm * group_sum;
            }
            sum
        })
    })
}

/// Code `k` of a row stored as one LSB-first bitstream of `bits`-bit fields.
fn code(row: &[u8], k: usize, bits: usize) -> usize {
    let bit = k * bits;
    let low = row[bit / 8] as usize;
    let high = row.get(bit / 8 + 1).copied().unwrap_or(0) as usize;
    ((low | (high << 8)) >> (bit % 8)) & ((1 << bits) - 1)
}
