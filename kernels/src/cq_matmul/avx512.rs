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

/// One row's codebook values in the 16-lane layout (`out[i]` the value of the code that
/// meets `xt[i]`): the lookups of [`dots`], stored instead of multiplied.
///
/// # Safety
/// The CPU must have AVX-512F; `codes` holds `out.len() · bits / 8` bytes and `out.len()`
/// is a multiple of `128 / bits`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn decode(codes: &[u8], bits: usize, table: &[f32; 16], out: &mut [f32]) {
    match bits {
        1 => decode_of::<1>(codes, table, out),
        2 => decode_of::<2>(codes, table, out),
        4 => decode_of::<4>(codes, table, out),
        _ => unreachable!("the layout sends only 1-, 2- and 4-bit codes to SIMD"),
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn decode_of<const B: usize>(codes: &[u8], table: &[f32; 16], out: &mut [f32]) {
    let per_byte = 8 / B;
    let chunk = 16 * per_byte;
    debug_assert!(out.len().is_multiple_of(chunk) && codes.len() == out.len() * B / 8);
    let lookup = _mm512_loadu_ps(table.as_ptr());
    for (c, chunk_out) in out.chunks_exact_mut(chunk).enumerate() {
        // Sound: chunk c's 16 code bytes start at 16·c and end within the row.
        let wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes.as_ptr().add(16 * c).cast()));
        for s in 0..per_byte {
            let count = _mm_cvtsi32_si128((s * B) as i32);
            let value = _mm512_permutexvar_ps(_mm512_srl_epi32(wide, count), lookup);
            _mm512_storeu_ps(chunk_out.as_mut_ptr().add(s * 16), value);
        }
    }
}

/// [`dots`] of `R` decoded rows ([`decode`]) with `T` tokens at once: each (row, token)
/// the same products summed in the same order as [`dots`] (16 lanes at a time through each
/// group, then `norm ·` the group's lanes), so the same bits; the tokens share each load
/// of a row's values.
///
/// # Safety
/// The CPU must have AVX-512F; every row of `values` and every token of `xts` has the
/// same length, of which `group`, a multiple of 16, is a divisor.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn decoded_dots<const R: usize, const T: usize>(
    values: [&[f32]; R],
    norms: [&[f32]; R],
    xts: [&[f32]; T],
    group: usize,
) -> [[f32; R]; T] {
    let len = xts[0].len();
    debug_assert!(group.is_multiple_of(16) && len.is_multiple_of(group));
    debug_assert!(values.iter().all(|row| row.len() == len));
    debug_assert!(xts.iter().all(|token| token.len() == len));
    let mut sums = [[_mm512_setzero_ps(); R]; T];
    for (g, start) in (0..len).step_by(group).enumerate() {
        let mut parts = [[_mm512_setzero_ps(); R]; T];
        for at in (start..start + group).step_by(16) {
            // Sound: `at + 16 ≤ len`, the length of every row and token.
            let x: [__m512; T] = std::array::from_fn(|t| _mm512_loadu_ps(xts[t].as_ptr().add(at)));
            for j in 0..R {
                let value = _mm512_loadu_ps(values[j].as_ptr().add(at));
                for t in 0..T {
                    parts[t][j] = _mm512_fmadd_ps(value, x[t], parts[t][j]);
                }
            }
        }
        for t in 0..T {
            for j in 0..R {
                let norm = _mm512_set1_ps(norms[j][g]);
                sums[t][j] = _mm512_fmadd_ps(norm, parts[t][j], sums[t][j]);
            }
        }
    }
    std::array::from_fn(|t| std::array::from_fn(|j| _mm512_reduce_add_ps(sums[t][j])))
}

/// One row's weights in the 16-lane layout (`out[i]` the weight that meets `xt[i]`): the
/// lookups of [`dots`], each times its group's norm, stored instead of multiplied.
///
/// # Safety
/// The CPU must have AVX-512F; `codes` holds `out.len() · bits / 8` bytes, `group` is a
/// multiple of `128 / bits` and divides `out.len()`, and `norms` holds a norm a group.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn decode_weights(
    codes: &[u8],
    bits: usize,
    table: &[f32; 16],
    norms: &[f32],
    group: usize,
    out: &mut [f32],
) {
    match bits {
        1 => decode_weights_of::<1>(codes, table, norms, group, out),
        2 => decode_weights_of::<2>(codes, table, norms, group, out),
        4 => decode_weights_of::<4>(codes, table, norms, group, out),
        _ => unreachable!("the layout sends only 1-, 2- and 4-bit codes to SIMD"),
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn decode_weights_of<const B: usize>(
    codes: &[u8],
    table: &[f32; 16],
    norms: &[f32],
    group: usize,
    out: &mut [f32],
) {
    let per_byte = 8 / B;
    let chunk = 16 * per_byte;
    debug_assert!(group.is_multiple_of(chunk) && out.len().is_multiple_of(group));
    debug_assert!(codes.len() == out.len() * B / 8 && norms.len() == out.len() / group);
    let lookup = _mm512_loadu_ps(table.as_ptr());
    for (c, chunk_out) in out.chunks_exact_mut(chunk).enumerate() {
        let norm = _mm512_set1_ps(norms[c * chunk / group]);
        // Sound: chunk c's 16 code bytes start at 16·c and end within the row.
        let wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes.as_ptr().add(16 * c).cast()));
        for s in 0..per_byte {
            let count = _mm_cvtsi32_si128((s * B) as i32);
            let value = _mm512_permutexvar_ps(_mm512_srl_epi32(wide, count), lookup);
            _mm512_storeu_ps(
                chunk_out.as_mut_ptr().add(s * 16),
                _mm512_mul_ps(value, norm),
            );
        }
    }
}

/// The products of `R` rows of weights ([`decode_weights`]) with one panel of `16 · V`
/// tokens (`panel[k · 16V + lane]`, [`super::panels::Panels`]): `out[r][lane] =
/// Σ_k weights[r][k] · panel[k][lane]`, each sum one multiply-add at a time in input order,
/// so a token's sums are the same whatever panel, lane or thread it is in. Tokens lie in
/// lanes and each weight is broadcast: `2 + R` loads feed `2R` multiply-adds (a 4-row by
/// 3-token tile of dot products needed 7 for 12, and a reduction across lanes a sum).
///
/// # Safety
/// The CPU must have AVX-512F; every row of `weights` holds `len` values and `panel`
/// `len · 16 · V`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn panel_dots<const R: usize, const V: usize>(
    weights: [&[f32]; R],
    panel: &[f32],
    out: &mut [[f32; 32]; R],
) {
    let len = weights[0].len();
    debug_assert!(V <= 2 && panel.len() == len * 16 * V);
    debug_assert!(weights.iter().all(|row| row.len() == len));
    let mut sums = [[_mm512_setzero_ps(); V]; R];
    for k in 0..len {
        // Sound: k < len, the length of every row, and the panel holds 16·V values an input.
        let x: [__m512; V] =
            std::array::from_fn(|v| _mm512_loadu_ps(panel.as_ptr().add((k * V + v) * 16)));
        for r in 0..R {
            let w = _mm512_set1_ps(*weights[r].get_unchecked(k));
            for v in 0..V {
                sums[r][v] = _mm512_fmadd_ps(w, x[v], sums[r][v]);
            }
        }
    }
    for (out, sums) in out.iter_mut().zip(sums) {
        for (v, sum) in sums.into_iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(16 * v), sum);
        }
    }
}

/// `dst[t · stride + j] = sums[j][t]` for 8 rows of 16 tokens: the sums transposed in
/// registers and each token's 8 outputs stored at once (one value at a time, the stores
/// were a tenth of a prompt product's time).
///
/// # Safety
/// The CPU must have AVX-512F, and the 16 runs of 8 floats `stride` apart from `dst` are
/// writable and no other thread's.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_transposed(sums: [&[f32; 16]; 8], dst: *mut f32, stride: usize) {
    let r: [__m512; 8] = std::array::from_fn(|j| _mm512_loadu_ps(sums[j].as_ptr()));
    // Within each 128-bit lane: rows interleaved in pairs, then in fours, so that lane l
    // of `fours[a]` (rows 0–3) and of `fours[a + 4]` (rows 4–7) hold token 4l + a.
    let pairs: [__m512; 8] = std::array::from_fn(|k| match k % 2 {
        0 => _mm512_unpacklo_ps(r[k], r[k + 1]),
        _ => _mm512_unpackhi_ps(r[k - 1], r[k]),
    });
    let fours: [__m512; 8] = std::array::from_fn(|k| {
        // k = 4h + a: rows 4h…4h+3 of token a of each lane's four.
        let (h, a) = (k / 4, k % 4);
        let (lo, hi) = (pairs[4 * h + a / 2], pairs[4 * h + 2 + a / 2]);
        match a % 2 {
            0 => _mm512_shuffle_ps::<0x44>(lo, hi),
            _ => _mm512_shuffle_ps::<0xEE>(lo, hi),
        }
    });
    let low = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    let high = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for a in 0..4 {
        // Tokens a, a + 4 (from `low`) and a + 8, a + 12 (from `high`), 8 rows each.
        for (half, index) in [(0, low), (1, high)] {
            let both = _mm512_permutex2var_ps(fours[a], index, fours[a + 4]);
            let first = a + 8 * half;
            _mm256_storeu_ps(dst.add(first * stride), _mm512_castps512_ps256(both));
            let upper = _mm512_shuffle_f32x4::<0xEE>(both, both);
            _mm256_storeu_ps(dst.add((first + 4) * stride), _mm512_castps512_ps256(upper));
        }
    }
}

/// The Walsh–Hadamard rotation of each group of `natural` (one token's padded inputs,
/// rotated in place; [`crate::hadamard::rotate_groups`]'s bits), then the 16-lane layout of
/// `per_byte` codes a byte ([`super::activations::Layout::arrange`]) into `out`, the scale
/// applied on the way.
///
/// # Safety
/// The CPU must have AVX-512F; `group` is a power of two and a multiple of `16 · per_byte`
/// that divides `natural.len()`, and `out` is as long as `natural`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn rotate_arrange(
    natural: &mut [f32],
    group: usize,
    per_byte: usize,
    out: &mut [f32],
) {
    debug_assert!(group.is_power_of_two() && group.is_multiple_of(16 * per_byte));
    debug_assert!(natural.len().is_multiple_of(group) && out.len() == natural.len());
    crate::hadamard::avx512::butterflies(natural, group);
    let scale = _mm512_set1_ps(crate::hadamard::scale(group));
    match per_byte {
        2 => arrange_of::<2>(natural, scale, out),
        4 => arrange_of::<4>(natural, scale, out),
        8 => arrange_of::<8>(natural, scale, out),
        _ => unreachable!("1-, 2- and 4-bit codes hold 8, 4 or 2 a byte"),
    }
}

/// [`arrange_of`] undone for the `per_byte` codes of a byte: `arranged` (one row's values in
/// the 16-lane layout) back into natural order in `out`, the same values.
///
/// # Safety
/// The CPU must have AVX-512F; `arranged` and `out` are as long, a multiple of
/// `16 · per_byte`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn natural(arranged: &[f32], per_byte: usize, out: &mut [f32]) {
    debug_assert!(arranged.len() == out.len() && out.len().is_multiple_of(16 * per_byte));
    match per_byte {
        2 => natural_of::<2>(arranged, out),
        4 => natural_of::<4>(arranged, out),
        8 => natural_of::<8>(arranged, out),
        _ => unreachable!("1-, 2- and 4-bit codes hold 8, 4 or 2 a byte"),
    }
}

/// `out[i·P + s] = arranged[s·16 + i]` in chunks of `16 · P`: each pass interleaves vector
/// `k` with vector `k + P/2` (the inverse of [`arrange_of`]'s split into evens and odds),
/// and after `log2 P` passes the chunk is back in order.
#[target_feature(enable = "avx512f")]
unsafe fn natural_of<const P: usize>(arranged: &[f32], out: &mut [f32]) {
    let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (src, dst) in arranged
        .chunks_exact(16 * P)
        .zip(out.chunks_exact_mut(16 * P))
    {
        // Sound: vector s of a chunk of 16 · P floats ends at 16 · (s + 1) ≤ 16 · P.
        let mut v: [__m512; P] = std::array::from_fn(|s| _mm512_loadu_ps(src.as_ptr().add(16 * s)));
        for _ in 0..P.trailing_zeros() {
            v = std::array::from_fn(|k| {
                let (j, take) = (k / 2, if k % 2 == 0 { low } else { high });
                _mm512_permutex2var_ps(v[j], take, v[j + P / 2])
            });
        }
        for (s, vector) in v.into_iter().enumerate() {
            _mm512_storeu_ps(dst.as_mut_ptr().add(16 * s), vector);
        }
    }
}

/// `rotated · scale` into `out` in chunks of `16 · P`, `out[s·16 + i] = in[i·P + s]`: each
/// pass splits every pair of vectors into its even and its odd elements, and after
/// `log2 P` passes vector `s` holds the elements `≡ s (mod P)`.
#[target_feature(enable = "avx512f")]
unsafe fn arrange_of<const P: usize>(rotated: &[f32], scale: __m512, out: &mut [f32]) {
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (src, dst) in rotated
        .chunks_exact(16 * P)
        .zip(out.chunks_exact_mut(16 * P))
    {
        // Sound: vector s of a chunk of 16 · P floats ends at 16 · (s + 1) ≤ 16 · P.
        let mut v: [__m512; P] = std::array::from_fn(|s| {
            _mm512_mul_ps(_mm512_loadu_ps(src.as_ptr().add(16 * s)), scale)
        });
        for _ in 0..P.trailing_zeros() {
            v = std::array::from_fn(|k| {
                let (pair, take) = (k % (P / 2), if k < P / 2 { evens } else { odds });
                _mm512_permutex2var_ps(v[2 * pair], take, v[2 * pair + 1])
            });
        }
        for (s, vector) in v.into_iter().enumerate() {
            _mm512_storeu_ps(dst.as_mut_ptr().add(16 * s), vector);
        }
    }
}
