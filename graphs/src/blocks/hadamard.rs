//! The Walsh–Hadamard matrix, which the CQ codes are rotated by (`cq_rows`, `cq_kernel`)
//! and Needle 2's MLP multiplies with (`crate::needle2::hadamard_mlp`), and the zero
//! padding both generations' MLPs widen their input to its size with.

use crate::blocks::context::OpForms;
use crate::builder::{GraphBuilder, Value};

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

/// `x` `[batch, sequence, from]` zero-padded to `to` along its last axis (no node when
/// `to == from`).
pub fn pad_to_width(
    b: &mut GraphBuilder,
    forms: OpForms,
    x: &Value,
    from: usize,
    to: usize,
) -> Value {
    match (to > from, forms) {
        (false, _) => x.clone(),
        (true, OpForms::Onnx) => b.pad_back(x, 3, 2, (to - from) as i64),
        // CoreML's MLProgram has no `Pad`; `x · [I | 0]` is the padded `x` exactly (one
        // product by 1 per output, the rest zeros).
        (true, OpForms::MobileAccelerators) => {
            let widen: Vec<f32> = (0..from * to)
                .map(|k| if k / to == k % to { 1.0 } else { 0.0 })
                .collect();
            let widen = b.const_float(&[from, to], &widen);
            b.matmul(x, &widen)
        }
    }
}
