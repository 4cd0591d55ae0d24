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
    let scale = (1.0 / (n as f64).sqrt()) as f32;
    x.iter_mut().for_each(|v| *v *= scale);
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
