//! The Walsh–Hadamard matrix, which the CQ codes are rotated by (`cq_rows`, `cq_kernel`)
//! and Needle 2's MLP multiplies with (`crate::needle2::hadamard_mlp`).

/// The orthonormal Walsh–Hadamard matrix of size `n` (a power of two), row-major:
/// entry `(i, j)` is `(-1)^popcount(i & j) / sqrt(n)`.
pub fn walsh_hadamard(n: usize) -> Vec<f32> {
    let scale = (1.0 / (n as f64).sqrt()) as f32;
    (0..n * n)
        .map(|k| {
            if ((k / n) & (k % n)).count_ones().is_multiple_of(2) {
                scale
            } else {
                -scale
            }
        })
        .collect()
}
