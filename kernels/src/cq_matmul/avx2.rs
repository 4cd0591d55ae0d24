//! The AVX2 path: 8 code bytes widened to 8 lanes, code `s` of each byte taken by a shift,
//! and looked up by `vpermps`, which reads an index's low 3 bits: one lookup for 1- and
//! 2-bit codes (the codebook repeated over 8 entries), two and a blend on bit 3 for 4-bit.

use std::arch::x86_64::*;

/// [`super::scalar::dots`] for 1-, 2- and 4-bit codes, `xt` in the 8-lane layout.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every row of `codes` holds `xt.len() · bits / 8` bytes,
/// `group` is a multiple of `64 / bits` and divides `xt.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dots<const R: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    bits: usize,
    table: &[f32; 16],
) -> [f32; R] {
    match bits {
        1 => dots_of::<R, 1>(codes, norms, xt, group, table),
        2 => dots_of::<R, 2>(codes, norms, xt, group, table),
        4 => dots_of::<R, 4>(codes, norms, xt, group, table),
        _ => unreachable!("the layout sends only 1-, 2- and 4-bit codes to SIMD"),
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dots_of<const R: usize, const B: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    table: &[f32; 16],
) -> [f32; R] {
    let per_byte = 8 / B;
    let chunk = 8 * per_byte;
    debug_assert!(group.is_multiple_of(chunk) && xt.len().is_multiple_of(group));
    debug_assert!(codes.iter().all(|row| row.len() == xt.len() * B / 8));
    let low_table = _mm256_loadu_ps(table.as_ptr());
    let high_table = _mm256_loadu_ps(table.as_ptr().add(8));
    let mut sums = [_mm256_setzero_ps(); R];
    for (g, group_xt) in xt.chunks_exact(group).enumerate() {
        let mut parts = [_mm256_setzero_ps(); R];
        for (c, chunk_xt) in group_xt.chunks_exact(chunk).enumerate() {
            let byte = (g * group + c * chunk) * B / 8;
            // Sound: the chunk's 8 code bytes start at `byte` and end within the row.
            let wide: [__m256i; R] = std::array::from_fn(|j| {
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes[j].as_ptr().add(byte).cast()))
            });
            for s in 0..per_byte {
                let x = _mm256_loadu_ps(chunk_xt.as_ptr().add(s * 8));
                let count = _mm_cvtsi32_si128((s * B) as i32);
                for j in 0..R {
                    let index = _mm256_srl_epi32(wide[j], count);
                    let low = _mm256_permutevar8x32_ps(low_table, index);
                    let value = if B == 4 {
                        let high = _mm256_permutevar8x32_ps(high_table, index);
                        let bit3 = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(index));
                        _mm256_blendv_ps(low, high, bit3)
                    } else {
                        low
                    };
                    parts[j] = _mm256_fmadd_ps(value, x, parts[j]);
                }
            }
        }
        for j in 0..R {
            sums[j] = _mm256_fmadd_ps(_mm256_set1_ps(norms[j][g]), parts[j], sums[j]);
        }
    }
    std::array::from_fn(|j| horizontal_sum(sums[j]))
}

/// [`dots`] over rows already decoded into the 8-lane layout: the same products summed
/// in the same order (8 lanes at a time through each group, then `norm ·` the group's
/// lanes), so the same bits.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every row of `values` is as long as `xt`, and `group`
/// is a multiple of 8 that divides `xt.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decoded_dots<const R: usize>(
    values: [&[f32]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
) -> [f32; R] {
    debug_assert!(group.is_multiple_of(8) && xt.len().is_multiple_of(group));
    debug_assert!(values.iter().all(|row| row.len() == xt.len()));
    let mut sums = [_mm256_setzero_ps(); R];
    for (g, group_xt) in xt.chunks_exact(group).enumerate() {
        let mut parts = [_mm256_setzero_ps(); R];
        for (k, lanes_xt) in group_xt.chunks_exact(8).enumerate() {
            let at = g * group + k * 8;
            // Sound: `at + 8 ≤ xt.len()`, and every row of `values` is as long.
            let x = _mm256_loadu_ps(lanes_xt.as_ptr());
            for j in 0..R {
                let value = _mm256_loadu_ps(values[j].as_ptr().add(at));
                parts[j] = _mm256_fmadd_ps(value, x, parts[j]);
            }
        }
        for j in 0..R {
            sums[j] = _mm256_fmadd_ps(_mm256_set1_ps(norms[j][g]), parts[j], sums[j]);
        }
    }
    std::array::from_fn(|j| horizontal_sum(sums[j]))
}

#[target_feature(enable = "avx2")]
unsafe fn horizontal_sum(v: __m256) -> f32 {
    let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps::<1>(pairs, pairs)))
}
