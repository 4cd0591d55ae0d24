//! The Walsh–Hadamard rotation of a CQ group, applied to the activation: a stored group is
//! `(codebook[idx] · norm) H` with `H` symmetric, so `w · x = (codebook[idx] · norm) · (H x)`
//! and one rotation of `x` per token serves every row of the matrix.

/// `H x` in place for `x` of power-of-two length `n`: the fast transform (`n log n`
/// butterflies) in the Sylvester order, `H[k][j] = (−1)^popcount(k & j) / √n`, the scale
/// computed in f64 and rounded to f32 as upstream's `_cq_hadamard_np` does.
pub(crate) fn rotate(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut half = 1;
    while half < n {
        for block in x.chunks_exact_mut(2 * half) {
            let (low, high) = block.split_at_mut(half);
            for (a, b) in low.iter_mut().zip(high) {
                let (sum, difference) = (*a + *b, *a - *b);
                *a = sum;
                *b = difference;
            }
        }
        half *= 2;
    }
    let scale = scale(n);
    x.iter_mut().for_each(|v| *v *= scale);
}

/// `1/√n` as [`rotate`] scales by it.
pub(crate) fn scale(n: usize) -> f32 {
    (1.0 / (n as f64).sqrt()) as f32
}

/// [`rotate`] of each run of `group` values of `x` on `isa`: the same butterflies in the
/// same stage order on every path, so the same bits; AVX-512 takes the stages within a
/// vector as permutes (one value at a time they were most of a Needle 2 MLP's time).
pub(crate) fn rotate_groups(isa: crate::isa::Isa, x: &mut [f32], group: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa == crate::isa::Isa::Avx512 && group.is_multiple_of(16) {
        // Sound: `Isa::available` offers AVX-512 only where AVX-512F was detected, and
        // the groups hold whole vectors.
        unsafe {
            avx512::butterflies(x, group);
            avx512::scaled(x, scale(group));
        }
        return;
    }
    let _ = isa;
    x.chunks_exact_mut(group).for_each(rotate);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::rotate`]'s butterflies (not its scale) of each run of `group` values of `x`
    /// in place, in the same stage order, so the same bits.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `group` is a power of two, a multiple of 16, that
    /// divides `x.len()`.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn butterflies(x: &mut [f32], group: usize) {
        debug_assert!(group.is_power_of_two() && group.is_multiple_of(16));
        debug_assert!(x.len().is_multiple_of(group));
        // Stages 1, 2, 4 and 8 pair lanes of one vector: each lane's partner by a permute,
        // then `a + b` where the lane is the pair's first and `a − b` where it is the second.
        for at in (0..x.len()).step_by(16) {
            // Sound: `at + 16 ≤ x.len()`, a multiple of 16.
            let p = x.as_mut_ptr().add(at);
            let mut v = _mm512_loadu_ps(p);
            v = butterfly(v, _mm512_permute_ps::<0xB1>(v), 0xAAAA);
            v = butterfly(v, _mm512_permute_ps::<0x4E>(v), 0xCCCC);
            v = butterfly(v, _mm512_shuffle_f32x4::<0xB1>(v, v), 0xF0F0);
            v = butterfly(v, _mm512_shuffle_f32x4::<0x4E>(v, v), 0xFF00);
            _mm512_storeu_ps(p, v);
        }
        // Stages of 16 and more pair whole vectors; a block of `2 · half` never leaves a group.
        let mut half = 16;
        while half < group {
            for block in x.chunks_exact_mut(2 * half) {
                let (low, high) = block.split_at_mut(half);
                for at in (0..half).step_by(16) {
                    // Sound: `at + 16 ≤ half`, the length of both halves.
                    let (a, b) = (low.as_mut_ptr().add(at), high.as_mut_ptr().add(at));
                    let (u, w) = (_mm512_loadu_ps(a), _mm512_loadu_ps(b));
                    _mm512_storeu_ps(a, _mm512_add_ps(u, w));
                    _mm512_storeu_ps(b, _mm512_sub_ps(u, w));
                }
            }
            half *= 2;
        }
    }

    /// `x ← x · scale`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `x.len()` is a multiple of 16.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn scaled(x: &mut [f32], scale: f32) {
        let scale = _mm512_set1_ps(scale);
        for at in (0..x.len()).step_by(16) {
            // Sound: `at + 16 ≤ x.len()`, a multiple of 16.
            let p = x.as_mut_ptr().add(at);
            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), scale));
        }
    }

    /// One butterfly stage within a vector: `x + partner` in the lanes outside `second`,
    /// `partner − x` (the pair's first minus its second) in those inside.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn butterfly(x: __m512, partner: __m512, second: __mmask16) -> __m512 {
        _mm512_mask_sub_ps(_mm512_add_ps(x, partner), second, partner, x)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_dense_matrix() {
        let n = 16;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut fast = x.clone();
        super::rotate(&mut fast);
        for (k, got) in fast.iter().enumerate() {
            let dense: f64 = (0..n)
                .map(|j| {
                    let sign = if (k & j).count_ones() % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    sign * x[j] as f64 / (n as f64).sqrt()
                })
                .sum();
            assert!((*got as f64 - dense).abs() < 1e-6, "{k}: {got} vs {dense}");
        }
    }
}
