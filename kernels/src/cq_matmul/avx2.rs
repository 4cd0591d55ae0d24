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
                    let value = lookup::<B>(index, low_table, high_table);
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

/// One row's codebook values in the 8-lane layout (`out[i]` the value of the code that
/// meets `xt[i]`): the lookups of [`dots`], stored instead of multiplied.
///
/// # Safety
/// The CPU must have AVX2; `codes` holds `out.len() · bits / 8` bytes and `out.len()` is
/// a multiple of `64 / bits`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decode(codes: &[u8], bits: usize, table: &[f32; 16], out: &mut [f32]) {
    match bits {
        1 => decode_of::<1>(codes, table, out),
        2 => decode_of::<2>(codes, table, out),
        4 => decode_of::<4>(codes, table, out),
        _ => unreachable!("the layout sends only 1-, 2- and 4-bit codes to SIMD"),
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn decode_of<const B: usize>(codes: &[u8], table: &[f32; 16], out: &mut [f32]) {
    let per_byte = 8 / B;
    let chunk = 8 * per_byte;
    debug_assert!(out.len().is_multiple_of(chunk) && codes.len() == out.len() * B / 8);
    let low_table = _mm256_loadu_ps(table.as_ptr());
    let high_table = _mm256_loadu_ps(table.as_ptr().add(8));
    for (c, chunk_out) in out.chunks_exact_mut(chunk).enumerate() {
        // Sound: chunk c's 8 code bytes start at 8·c and end within the row.
        let wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(8 * c).cast()));
        for s in 0..per_byte {
            let count = _mm_cvtsi32_si128((s * B) as i32);
            let value = lookup::<B>(_mm256_srl_epi32(wide, count), low_table, high_table);
            _mm256_storeu_ps(chunk_out.as_mut_ptr().add(s * 8), value);
        }
    }
}

/// The codebook value of each lane's low `B` bits (`vpermps` reads the low 3; 4-bit codes
/// pick between the two halves of the table on bit 3).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lookup<const B: usize>(index: __m256i, low_table: __m256, high_table: __m256) -> __m256 {
    let low = _mm256_permutevar8x32_ps(low_table, index);
    if B == 4 {
        let high = _mm256_permutevar8x32_ps(high_table, index);
        let bit3 = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(index));
        _mm256_blendv_ps(low, high, bit3)
    } else {
        low
    }
}

/// [`dots`] of `R` decoded rows ([`decode`]) with `T` tokens at once: each (row, token)
/// the same products summed in the same order as [`dots`] (8 lanes at a time through each
/// group, then `norm ·` the group's lanes), so the same bits; the tokens share each load
/// of a row's values.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every row of `values` and every token of `xts` has the
/// same length, of which `group`, a multiple of 8, is a divisor.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decoded_dots<const R: usize, const T: usize>(
    values: [&[f32]; R],
    norms: [&[f32]; R],
    xts: [&[f32]; T],
    group: usize,
) -> [[f32; R]; T] {
    let len = xts[0].len();
    debug_assert!(group.is_multiple_of(8) && len.is_multiple_of(group));
    debug_assert!(values.iter().all(|row| row.len() == len));
    debug_assert!(xts.iter().all(|token| token.len() == len));
    let mut sums = [[_mm256_setzero_ps(); R]; T];
    for (g, start) in (0..len).step_by(group).enumerate() {
        let mut parts = [[_mm256_setzero_ps(); R]; T];
        for at in (start..start + group).step_by(8) {
            // Sound: `at + 8 ≤ len`, the length of every row and token.
            let x: [__m256; T] = std::array::from_fn(|t| _mm256_loadu_ps(xts[t].as_ptr().add(at)));
            for j in 0..R {
                let value = _mm256_loadu_ps(values[j].as_ptr().add(at));
                for t in 0..T {
                    parts[t][j] = _mm256_fmadd_ps(value, x[t], parts[t][j]);
                }
            }
        }
        for t in 0..T {
            for j in 0..R {
                let norm = _mm256_set1_ps(norms[j][g]);
                sums[t][j] = _mm256_fmadd_ps(norm, parts[t][j], sums[t][j]);
            }
        }
    }
    std::array::from_fn(|t| std::array::from_fn(|j| horizontal_sum(sums[t][j])))
}

#[target_feature(enable = "avx2")]
unsafe fn horizontal_sum(v: __m256) -> f32 {
    let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps::<1>(pairs, pairs)))
}
