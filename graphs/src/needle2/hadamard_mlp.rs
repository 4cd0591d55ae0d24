//! Needle `HadamardMLP`: `d3 · H · silu(d2 · H · (d1 · x))`, with `x` zero-padded to
//! `n` (the next power of two) and the result cut back to `d_model`; `H` is the
//! orthonormal Walsh–Hadamard matrix of size `n`.
//!
//! `H_n = H_a ⊗ H_b` (Sylvester order, `n = a·b`), so `z·H_n` is `H_a·Z·H_b` with
//! `z` viewed as an `a×b` matrix: two small MatMuls with constants shared by all
//! layers, `n·(a+b)` multiply-adds instead of `n²`.
//!
//! Graphs with the Needle ops run it, with its pre-norm and residual add, as one
//! `needle.HadamardMlp` node ([`hadamard_mlp_op`]).
//!
//! ```text
//! x ─Pad─ *d1 ─H─ *d2 ─silu─ H ─ *d3 ─Slice─▶      H: Reshape[a,b] ─ H_a·Z ─ Z·H_b ─ Reshape[n]
//! ```

use crate::blocks::context::BuildContext;
use crate::blocks::hadamard::{pad_to_width, walsh_hadamard};
use crate::builder::{GraphBuilder, Value};
use crate::contract::needle_ops;
use crate::needle2::{Config, LayerWeights};

/// `x`: `[batch, sequence, d_model]` → `[batch, sequence, d_model]`.
pub fn hadamard_mlp(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    x: &Value,
    w: &LayerWeights,
) -> Value {
    let d_model = ctx.common.d_model;
    let n = w.d1.data.len();
    let [d1, d2, d3] = diagonals(b, w);
    let z = pad_to_width(b, ctx.kernels.op_forms, x, d_model, n);
    let z = b.mul(&d1, &z);
    let z = walsh_hadamard_transform(b, &z, n);
    let z = b.mul(&d2, &z);
    let gate = b.sigmoid(&z);
    let z = b.mul(&z, &gate);
    let z = walsh_hadamard_transform(b, &z, n);
    let z = b.mul(&d3, &z);
    if n > d_model {
        b.slice(&z, 2, 0, d_model as i64)
    } else {
        z
    }
}

/// The layer's MLP half `x + mlp(norm(x))` as one `needle.HadamardMlp` node (graphs with
/// the Needle ops), `gain` the pre-MLP norm's.
pub fn hadamard_mlp_op(b: &mut GraphBuilder, x: &Value, gain: &Value, w: &LayerWeights) -> Value {
    let [d1, d2, d3] = diagonals(b, w);
    b.op_in(
        needle_ops::DOMAIN,
        needle_ops::HADAMARD_MLP,
        &[x, &d1, &d2, &d3, gain],
        vec![],
        1,
    )
    .remove(0)
}

/// The MLP's diagonals `d1`, `d2`, `d3` as initializers.
fn diagonals(b: &mut GraphBuilder, w: &LayerWeights) -> [Value; 3] {
    let n = w.d1.data.len();
    [("d1", &w.d1), ("d2", &w.d2), ("d3", &w.d3)].map(|(name, t)| b.weight(name, &[n], &t.data))
}

/// `z · H_n` over the last axis of `[batch, sequence, n]`, as `H_a · Z · H_b`.
fn walsh_hadamard_transform(b: &mut GraphBuilder, z: &Value, n: usize) -> Value {
    let a = 1usize << (n.trailing_zeros() / 2);
    let cols = n / a;
    let h_a = b.const_float(&[a, a], &walsh_hadamard(a));
    let h_b = b.const_float(&[cols, cols], &walsh_hadamard(cols));
    let m = b.reshape(z, &[0, 0, a as i64, cols as i64]);
    let m = b.matmul(&h_a, &m);
    let m = b.matmul(&m, &h_b);
    b.reshape(&m, &[0, 0, n as i64])
}
