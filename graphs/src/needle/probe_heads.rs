//! The Needle 2 probe heads (upstream `probe_pool`, `ContrastiveHead`, `ConfidenceHead`)
//! over the hidden cells `[batch, sequence, L+1, d]` (the scaled embedding, then each
//! layer's lane mean), as the graph outputs `contrastive_embedding` and
//! `confidence_logit`. Every cell of every layer is one position of the pooling:
//!
//! ```text
//! scores[k,(t,l)] = cells[t,l]·probes[k] / √d   (padding: −∞)      a = softmax_(t,l)(scores)
//! pooled = concat_k(Σ_(t,l) a·cells[t,l])                             [batch, P·d]
//! contrastive: p = pooled·projᵀ,  p / √(Σp² + 1e-12)                  [batch, contrastive_dim]
//! confidence:  pooled·projᵀ + bias                                    [batch]
//! ```
//! The heads pool over the positions of one call, so they are a sequence's when it is
//! fed whole with an empty cache.

use crate::builder::{GraphBuilder, Value};
use crate::contract::Precision;
use crate::needle::{ProbeHead, Tensor};
use crate::onnx::data_type;

/// Upstream `probe_pool`'s attention: `[batch, rows, k, d]`, for each of `rows` groups
/// of cells the `k` probes' softmax-weighted sums over the group's `cells` positions.
/// `cells`: `[batch, rows, cells, d]`; `probes_t`: `[rows, d, k]` (or `[d, k]`, one set
/// for every group); `keep`: int64, 1 for real positions, broadcastable to
/// `[batch, 1, cells, 1]`. Needle 3 pools each layer's row on its own, Needle 2 all
/// of them as one row.
pub fn probe_attention(
    b: &mut GraphBuilder,
    cells: &Value,
    probes_t: &Value,
    keep: &Value,
    d: usize,
) -> Value {
    let root_d = b.scalar_float((d as f32).sqrt());
    let scores = b.matmul(cells, probes_t); // [B, rows, C, k]
    let scores = b.div(&scores, &root_d);
    let keep = b.cast(keep, data_type::BOOL);
    let lowest = b.scalar_float(f32::NEG_INFINITY);
    let scores = b.where_(&keep, &scores, &lowest);
    let attend = b.softmax(&scores, 2);
    let attend = b.transpose(&attend, &[0, 1, 3, 2]); // [B, rows, k, C]
    b.matmul(&attend, cells)
}

/// Upstream `probe_pool` of Needle 2: `[batch, P·d]`. `cells`: the `L+1` cells
/// `[batch, sequence, d]`; `keep`: `[batch, sequence]` int64, 1 for the row's real tokens.
fn probe_pool(b: &mut GraphBuilder, cells: &[Value], keep: &Value, probes: &Tensor) -> Value {
    let (p, d) = (probes.shape[0], probes.shape[1]);
    let rows = cells.len() as i64;
    let cells: Vec<Value> = cells.iter().map(|c| b.unsqueeze(c, &[2])).collect();
    let refs: Vec<&Value> = cells.iter().collect();
    let cells = b.concat(&refs, 2); // [B, S, L+1, d]
                                    // Upstream's `reshape(b, t·l, d)`: position-major, layer-minor.
    let cells = b.reshape(&cells, &[0, 1, -1, d as i64]);
    let keep = b.unsqueeze(keep, &[2]);
    let per_layer = b.const_i64(&[1, 1, rows]);
    let keep = b.op1("Expand", &[&keep, &per_layer], vec![]);
    let keep = b.reshape(&keep, &[0, 1, -1, 1]);
    let probes_t = transpose(&probes.data, p, d);
    let probes_t = b.weight("probes_t", &[d, p], &probes_t);
    let pooled = probe_attention(b, &cells, &probes_t, &keep, d); // [B, 1, P, d]
    b.reshape(&pooled, &[0, (p * d) as i64])
}

/// `ContrastiveHead`: the unit-norm embedding `[batch, out]`, float32.
pub fn contrastive_embedding(
    b: &mut GraphBuilder,
    cells: &[Value],
    keep: &Value,
    head: &ProbeHead,
) -> Value {
    let pooled = probe_pool(b, cells, keep, &head.probes);
    // Upstream's Dense has no bias here; the file's bias is the exporter's zeros.
    let proj_t = projection_t(b, &head.proj);
    let p = b.matmul(&pooled, &proj_t);
    let square = b.mul(&p, &p);
    let sum = b.reduce_sum(&square, &[1], true);
    let eps = b.scalar_float(1e-12);
    let sum = b.add(&sum, &eps);
    let norm = b.sqrt(&sum);
    let unit = b.div(&p, &norm);
    to_float32(b, unit)
}

/// `ConfidenceHead`: the logit `[batch]`, float32.
pub fn confidence_logit(
    b: &mut GraphBuilder,
    cells: &[Value],
    keep: &Value,
    head: &ProbeHead,
) -> Value {
    let pooled = probe_pool(b, cells, keep, &head.probes);
    let proj_t = projection_t(b, &head.proj);
    let logit = b.matmul(&pooled, &proj_t);
    let bias = b.weight("bias", &head.bias.shape, &head.bias.data);
    let logit = b.add(&logit, &bias);
    let logit = b.squeeze(&logit, &[1]);
    to_float32(b, logit)
}

/// The head's `proj` `[out, P·d]` as the initializer `proj_t` `[P·d, out]`.
fn projection_t(b: &mut GraphBuilder, proj: &Tensor) -> Value {
    let (out, inner) = (proj.shape[0], proj.shape[1]);
    b.weight("proj_t", &[inner, out], &transpose(&proj.data, out, inner))
}

/// `[rows, cols]` row-major → `[cols, rows]`.
fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

fn to_float32(b: &mut GraphBuilder, x: Value) -> Value {
    match b.precision() {
        Precision::Fp32 => x,
        Precision::Fp16 => b.cast(&x, data_type::FLOAT),
    }
}
