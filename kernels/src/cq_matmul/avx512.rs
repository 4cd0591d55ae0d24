//! The AVX-512F path: 16 code bytes widened to 16 lanes, code `s` of each byte taken by a
//! shift, and looked up in the 16-entry codebook by one `vpermps` (which reads only an
//! index's low 4 bits, so the codes above need no mask).

use std::arch::x86_64::*;

/// [`super::scalar::dots`] for 1-, 2- and 4-bit codes, `xt` in the 16-lane layout.
///
/// # Safety
/// The CPU must have AVX-512F; every row of `codes` holds `xt.len() · bits / 8` bytes,
/// `group` is a multiple of `128 / bits` and divides `xt.len()`.
#[target_feature(enable = "avx512f")]
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

#[target_feature(enable = "avx512f")]
unsafe fn dots_of<const R: usize, const B: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    table: &[f32; 16],
) -> [f32; R] {
    let per_byte = 8 / B;
    let chunk = 16 * per_byte;
    debug_assert!(group.is_multiple_of(chunk) && xt.len().is_multiple_of(group));
    debug_assert!(codes.iter().all(|row| row.len() == xt.len() * B / 8));
    let lookup = _mm512_loadu_ps(table.as_ptr());
    let mut sums = [_mm512_setzero_ps(); R];
    for (g, group_xt) in xt.chunks_exact(group).enumerate() {
        let mut parts = [_mm512_setzero_ps(); R];
        for (c, chunk_xt) in group_xt.chunks_exact(chunk).enumerate() {
            let byte = (g * group + c * chunk) * B / 8;
            // Sound: the chunk's 16 code bytes start at `byte` and end within the row
            // (its bytes cover the same inputs as `xt`).
            let wide: [__m512i; R] = std::array::from_fn(|j| {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(codes[j].as_ptr().add(byte).cast()))
            });
            for s in 0..per_byte {
                let x = _mm512_loadu_ps(chunk_xt.as_ptr().add(s * 16));
                let count = _mm_cvtsi32_si128((s * B) as i32);
                for j in 0..R {
                    let value = _mm512_permutexvar_ps(_mm512_srl_epi32(wide[j], count), lookup);
                    parts[j] = _mm512_fmadd_ps(value, x, parts[j]);
                }
            }
        }
        for j in 0..R {
            sums[j] = _mm512_fmadd_ps(_mm512_set1_ps(norms[j][g]), parts[j], sums[j]);
        }
    }
    std::array::from_fn(|j| _mm512_reduce_add_ps(sums[j]))
}

/// [`dots`] over rows already decoded into the 16-lane layout: the same products summed
/// in the same order, so the same bits.
///
/// # Safety
/// The CPU must have AVX-512F; every row of `values` is as long as `xt`, and `group` is a
/// multiple of 16 that divides `xt.len()`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn decoded_dots<const R: usize>(
    values: [&[f32]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
) -> [f32; R] {
    debug_assert!(group.is_multiple_of(16) && xt.len().is_multiple_of(group));
    debug_assert!(values.iter().all(|row| row.len() == xt.len()));
    let mut sums = [_mm512_setzero_ps(); R];
    for (g, group_xt) in xt.chunks_exact(group).enumerate() {
        let mut parts = [_mm512_setzero_ps(); R];
        for (k, lanes_xt) in group_xt.chunks_exact(16).enumerate() {
            let at = g * group + k * 16;
            // Sound: `at + 16 ≤ xt.len()`, and every row of `values` is as long.
            let x = _mm512_loadu_ps(lanes_xt.as_ptr());
            for j in 0..R {
                let value = _mm512_loadu_ps(values[j].as_ptr().add(at));
                parts[j] = _mm512_fmadd_ps(value, x, parts[j]);
            }
        }
        for j in 0..R {
            sums[j] = _mm512_fmadd_ps(_mm512_set1_ps(norms[j][g]), parts[j], sums[j]);
        }
    }
    std::array::from_fn(|j| _mm512_reduce_add_ps(sums[j]))
}
