//! Needle 3 `HadamardMLP` (`architecture.py`, 3.2.8), a Monarch MLP: with `x`
//! zero-padded to `n` (the next power of two), `n = a·b`,
//!
//! ```text
//! cond = 1 + softmax(x·cond_v)·cond_u
//! z = K₁(d1·z)[p1];  z = K₂(silu(d2·cond·z + b2))[p2];  z = K₃(d3·z);  out = (d4·z)[:d_model]
//! K_s(z) = A_sᵀ · Z · B_s   (z viewed as an a×b matrix, A_s = w{s}a, B_s = w{s}b)
//! ```
//!
//! Each stage is two small MatMuls (`n·(a+b)` multiply-adds instead of `n²`) and each
//! permutation a Gather (in the accelerator forms, a product by the permutation matrix,
//! since CoreML's MLProgram has no `Gather`); `A_sᵀ` is stored transposed so no
//! Transpose runs.

use crate::blocks::context::OpForms;
use crate::blocks::hadamard::pad_to_width;
use crate::blocks::transpose::transpose_last;
use crate::blocks::weights::Tensor;
use crate::builder::{GraphBuilder, Value};
use crate::contract::needle_ops;
use crate::needle3::MonarchWeights;

/// `x`: `[batch, sequence, d_model]` → `[batch, sequence, d_model]`. `p1`, `p2`: the
/// model's permutation constants (shared by every layer), as [`permutations`] wrote them
/// for `forms`.
pub fn monarch_mlp(
    b: &mut GraphBuilder,
    forms: OpForms,
    x: &Value,
    w: &MonarchWeights,
    [p1, p2]: [&Value; 2],
    d_model: usize,
) -> Value {
    let n = w.d1.data.len();
    let cond = b.scope("cond", |b| {
        let v = b.weight("cond_v", &w.cond_v.shape, &w.cond_v.data);
        let u = b.weight("cond_u", &w.cond_u.shape, &w.cond_u.data);
        let mix = b.matmul(x, &v);
        let mix = b.softmax(&mix, -1);
        let mix = b.matmul(&mix, &u);
        let one = b.scalar_float(1.0);
        b.add(&one, &mix)
    });
    let d1 = b.weight("d1", &[n], &w.d1.data);
    let d2 = b.weight("d2", &[n], &w.d2.data);
    let b2 = b.weight("b2", &[n], &w.b2.data);
    let d3 = b.weight("d3", &[n], &w.d3.data);
    let d4 = b.weight("d4", &[n], &w.d4.data);
    let z = pad_to_width(b, forms, x, d_model, n);
    let z = b.mul(&d1, &z);
    let z = b.scope("stage1", |b| kron_apply(b, &z, &w.w1a, &w.w1b));
    let z = permute(b, forms, &z, p1);
    let z = b.mul(&d2, &z);
    let z = b.mul(&z, &cond);
    let z = b.add(&z, &b2);
    let gate = b.sigmoid(&z);
    let z = b.mul(&z, &gate);
    let z = b.scope("stage2", |b| kron_apply(b, &z, &w.w2a, &w.w2b));
    let z = permute(b, forms, &z, p2);
    let z = b.mul(&d3, &z);
    let z = b.scope("stage3", |b| kron_apply(b, &z, &w.w3a, &w.w3b));
    let z = b.mul(&d4, &z);
    if n > d_model {
        b.slice(&z, 2, 0, d_model as i64)
    } else {
        z
    }
}

/// The layer's MLP half `x + monarch_mlp(norm(x))` as one `needle.MonarchMlp` node (packed
/// graphs, which onnxruntime runs with the Needle kernels loaded): the ~27 nodes of the MLP,
/// its pre-norm (`gain`) and the residual add in one launch. `p1`, `p2` as [`permutations`]
/// wrote them for [`OpForms::Onnx`].
pub fn monarch_mlp_op(
    b: &mut GraphBuilder,
    x: &Value,
    gain: &Value,
    w: &MonarchWeights,
    [p1, p2]: [&Value; 2],
) -> Value {
    let n = w.d1.data.len();
    let cond_v = b.weight("cond_v", &w.cond_v.shape, &w.cond_v.data);
    let cond_u = b.weight("cond_u", &w.cond_u.shape, &w.cond_u.data);
    let [d1, d2, b2, d3, d4] = [
        ("d1", &w.d1),
        ("d2", &w.d2),
        ("b2", &w.b2),
        ("d3", &w.d3),
        ("d4", &w.d4),
    ]
    .map(|(name, t)| b.weight(name, &[n], &t.data));
    let stages = [
        ("stage1", &w.w1a, &w.w1b),
        ("stage2", &w.w2a, &w.w2b),
        ("stage3", &w.w3a, &w.w3b),
    ]
    .map(|(scope, a, bm)| {
        b.scope(scope, |b| {
            let (ra, rb) = (a.shape[0], bm.shape[0]);
            let at = b.weight("a_t", &[ra, ra], &transpose_last(&a.data, 1, ra, ra));
            [at, b.weight("b", &[rb, rb], &bm.data)]
        })
    });
    let [[a1, b1], [a2, b2s], [a3, b3]] = &stages;
    let inputs = [
        x, &cond_v, &cond_u, &d1, &d2, &b2, &d3, &d4, a1, b1, a2, b2s, a3, b3, p1, p2, gain,
    ];
    b.op_in(
        needle_ops::DOMAIN,
        needle_ops::MONARCH_MLP,
        &inputs,
        vec![],
        1,
    )
    .remove(0)
}

/// The permutation `p` of `0..n` as `z[.., p[j]]` takes it: indices for a `Gather`, or
/// the `[n, n]` matrix with a 1 at `(p[j], j)`.
pub fn permutations(b: &mut GraphBuilder, forms: OpForms, p: &[i64]) -> Value {
    match forms {
        OpForms::Onnx => b.const_i64(p),
        OpForms::MobileAccelerators => {
            let n = p.len();
            let mut matrix = vec![0.0; n * n];
            for (j, &from) in p.iter().enumerate() {
                matrix[from as usize * n + j] = 1.0;
            }
            b.const_float(&[n, n], &matrix)
        }
    }
}

/// `z[.., p[j]]` over the last axis, `p` from [`permutations`].
fn permute(b: &mut GraphBuilder, forms: OpForms, z: &Value, p: &Value) -> Value {
    match forms {
        OpForms::Onnx => b.gather(z, p, 2),
        OpForms::MobileAccelerators => b.matmul(z, p),
    }
}

/// Upstream `_kron_apply`: `[batch, sequence, a·b]` → `Aᵀ · Z · B`, flattened again.
fn kron_apply(b: &mut GraphBuilder, z: &Value, a: &Tensor, bm: &Tensor) -> Value {
    let (ra, rb) = (a.shape[0], bm.shape[0]);
    let at = transpose_last(&a.data, 1, ra, ra);
    let at = b.weight("a_t", &[ra, ra], &at);
    let bw = b.weight("b", &[rb, rb], &bm.data);
    let z = b.reshape(z, &[0, 0, ra as i64, rb as i64]);
    let z = b.matmul(&z, &bw);
    let z = b.matmul(&at, &z);
    b.reshape(&z, &[0, 0, (ra * rb) as i64])
}
