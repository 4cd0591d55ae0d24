//! The AVX2 path. Two lookups, each chosen for what is cheap on the CPUs measured (AMD
//! Zen 3, where the lane-crossing `vpermps` takes two cycles and in-lane shuffles two a
//! cycle):
//! - 1- and 2-bit codes: 8 code bytes widened to 8 lanes, code `s` of each byte taken by a
//!   shift and looked up by `vpermilps`, which reads an index's low 2 bits within its
//!   128-bit lane (the codebook repeated over 4 entries in both lanes);
//! - 4-bit codes: 16 code bytes (32 codes) at once, low nibbles in the low 128-bit lane and
//!   high nibbles in the high one, each nibble looking up the four bytes of its float in
//!   four `vpshufb` tables, the bytes interleaved back into floats. Vector `v` of a chunk
//!   then holds, in element `e`, the code of input `8v + 2(e mod 4) + e / 4`
//!   ([`super::activations::Layout`] arranges the activations to match).

use super::{Table, NIBBLE_CHUNK};
use std::arch::x86_64::*;

/// [`super::scalar::dots`] for 1-, 2- and 4-bit codes, `xt` in this path's layout.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every row of `codes` holds `xt.len() · bits / 8` bytes,
/// `group` is a multiple of `64 / bits` (of [`NIBBLE_CHUNK`] for 4-bit codes) and divides
/// `xt.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dots<const R: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    bits: usize,
    table: &Table,
) -> [f32; R] {
    match bits {
        1 => dots_of::<R, 1>(codes, norms, xt, group, table),
        2 => dots_of::<R, 2>(codes, norms, xt, group, table),
        4 => nibble_dots::<R>(codes, norms, xt, group, table),
        _ => unreachable!("the layout sends only 1-, 2- and 4-bit codes to SIMD"),
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dots_of<const R: usize, const B: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    table: &Table,
) -> [f32; R] {
    let per_byte = 8 / B;
    let chunk = 8 * per_byte;
    debug_assert!(group.is_multiple_of(chunk) && xt.len().is_multiple_of(group));
    debug_assert!(codes.iter().all(|row| row.len() == xt.len() * B / 8));
    let lookup = crumb_table(table);
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
                    let value = _mm256_permutevar_ps(lookup, index);
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

/// The first 4 entries of `table` in both 128-bit lanes: what `vpermilps` looks up. An
/// unaligned load: the table is an `[f32; 16]`, 4-byte aligned (a reference to it as an
/// `__m128` was undefined behaviour, which debug builds caught once the stack moved).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn crumb_table(table: &Table) -> __m256 {
    let four = _mm_loadu_ps(table.values.as_ptr());
    _mm256_set_m128(four, four)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn nibble_dots<const R: usize>(
    codes: [&[u8]; R],
    norms: [&[f32]; R],
    xt: &[f32],
    group: usize,
    table: &Table,
) -> [f32; R] {
    debug_assert!(group.is_multiple_of(NIBBLE_CHUNK) && xt.len().is_multiple_of(group));
    debug_assert!(codes.iter().all(|row| row.len() == xt.len() / 2));
    let tables = NibbleTables::new(table);
    let mut sums = [_mm256_setzero_ps(); R];
    for (g, group_xt) in xt.chunks_exact(group).enumerate() {
        let mut parts = [_mm256_setzero_ps(); R];
        for (c, chunk_xt) in group_xt.chunks_exact(NIBBLE_CHUNK).enumerate() {
            let byte = (g * group + c * NIBBLE_CHUNK) / 2;
            for j in 0..R {
                // Sound: the chunk's 16 code bytes start at `byte` and end within the row.
                let values = tables.lookup(codes[j].as_ptr().add(byte));
                for (v, value) in values.into_iter().enumerate() {
                    let x = _mm256_loadu_ps(chunk_xt.as_ptr().add(8 * v));
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

/// The four byte planes of a 16-entry codebook as `vpshufb` tables.
struct NibbleTables {
    planes: [__m256i; 4],
    shifts: __m256i,
    low_nibble: __m256i,
}

impl NibbleTables {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn new(table: &Table) -> NibbleTables {
        let planes = table
            .byte_planes
            .map(|bytes| _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast())));
        NibbleTables {
            planes,
            shifts: _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4),
            low_nibble: _mm256_set1_epi8(0x0f),
        }
    }

    /// The codebook values of the 32 codes in the 16 bytes at `codes`, as four vectors in
    /// this path's order.
    ///
    /// # Safety
    /// 16 bytes must be readable at `codes`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lookup(&self, codes: *const u8) -> [__m256; 4] {
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(codes.cast()));
        let index = _mm256_and_si256(_mm256_srlv_epi32(both, self.shifts), self.low_nibble);
        let [b0, b1, b2, b3] = self.planes.map(|plane| _mm256_shuffle_epi8(plane, index));
        let (low01, high01) = (_mm256_unpacklo_epi8(b0, b1), _mm256_unpackhi_epi8(b0, b1));
        let (low23, high23) = (_mm256_unpacklo_epi8(b2, b3), _mm256_unpackhi_epi8(b2, b3));
        [
            _mm256_unpacklo_epi16(low01, low23),
            _mm256_unpackhi_epi16(low01, low23),
            _mm256_unpacklo_epi16(high01, high23),
            _mm256_unpackhi_epi16(high01, high23),
        ]
        .map(|v| _mm256_castsi256_ps(v))
    }
}

/// One row's codebook values in this path's layout (`out[i]` the value of the code that
/// meets `xt[i]`): the lookups of [`dots`], stored instead of multiplied.
///
/// # Safety
/// The CPU must have AVX2; `codes` holds `out.len() · bits / 8` bytes and `out.len()` is
/// a multiple of `64 / bits` ([`NIBBLE_CHUNK`] for 4-bit codes).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decode(codes: &[u8], bits: usize, table: &Table, out: &mut [f32]) {
    match bits {
        1 => decode_of::<1>(codes, table, out),
        2 => decode_of::<2>(codes, table, out),
        4 => nibble_decode(codes, table, out),
        _ => unreachable!("the layout sends only 1-, 2- and 4-bit codes to SIMD"),
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn decode_of<const B: usize>(codes: &[u8], table: &Table, out: &mut [f32]) {
    let per_byte = 8 / B;
    let chunk = 8 * per_byte;
    debug_assert!(out.len().is_multiple_of(chunk) && codes.len() == out.len() * B / 8);
    let lookup = crumb_table(table);
    for (c, chunk_out) in out.chunks_exact_mut(chunk).enumerate() {
        // Sound: chunk c's 8 code bytes start at 8·c and end within the row.
        let wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(8 * c).cast()));
        for s in 0..per_byte {
            let count = _mm_cvtsi32_si128((s * B) as i32);
            let value = _mm256_permutevar_ps(lookup, _mm256_srl_epi32(wide, count));
            _mm256_storeu_ps(chunk_out.as_mut_ptr().add(s * 8), value);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn nibble_decode(codes: &[u8], table: &Table, out: &mut [f32]) {
    debug_assert!(out.len().is_multiple_of(NIBBLE_CHUNK) && codes.len() == out.len() / 2);
    let tables = NibbleTables::new(table);
    for (c, chunk_out) in out.chunks_exact_mut(NIBBLE_CHUNK).enumerate() {
        // Sound: chunk c's 16 code bytes start at 16·c and end within the row.
        let values = tables.lookup(codes.as_ptr().add(16 * c));
        for (v, value) in values.into_iter().enumerate() {
            _mm256_storeu_ps(chunk_out.as_mut_ptr().add(8 * v), value);
        }
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
