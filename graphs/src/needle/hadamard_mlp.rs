//! Needle `HadamardMLP`: `d3 · H · silu(d2 · H · (d1 · x))`, with `x` zero-padded to
//! `n` (the next power of two) and the result cut back to `d_model`; `H` is the
//! orthonormal Walsh–Hadamard matrix of size `n`, one constant shared by all layers.
//!
//! ```text
//! x ─Pad─ *d1 ─MatMul H─ *d2 ─silu─ MatMul H ─ *d3 ─Slice─▶
//! ```

use crate::builder::{GraphBuilder, Value};
use crate::needle::LayerWeights;

/// `x`: `[batch, sequence, d_model]` → `[batch, sequence, d_model]`.
pub fn hadamard_mlp(b: &mut GraphBuilder, x: &Value, w: &LayerWeights, d_model: usize) -> Value {
    let n = w.d1.data.len();
    let h = b.const_float(&[n, n], &walsh_hadamard(n));
    let d1 = b.weight("d1", &[n], &w.d1.data);
    let d2 = b.weight("d2", &[n], &w.d2.data);
    let d3 = b.weight("d3", &[n], &w.d3.data);
    let z = if n > d_model { b.pad_back(x, 3, 2, (n - d_model) as i64) } else { x.clone() };
    let z = b.mul(&d1, &z);
    let z = b.matmul(&z, &h);
    let z = b.mul(&d2, &z);
    let gate = b.sigmoid(&z);
    let z = b.mul(&z, &gate);
    let z = b.matmul(&z, &h);
    let z = b.mul(&d3, &z);
    if n > d_model { b.slice(&z, 2, 0, d_model as i64) } else { z }
}

/// The orthonormal Walsh–Hadamard matrix of size `n` (a power of two), row-major:
/// entry `(i, j)` is `(-1)^popcount(i & j) / sqrt(n)`.
pub fn walsh_hadamard(n: usize) -> Vec<f32> {
    let scale = (1.0 / (n as f64).sqrt()) as f32;
    (0..n * n)
        .map(|k| if ((k / n) & (k % n)).count_ones() % 2 == 0 { scale } else { -scale })
        .collect()
}
