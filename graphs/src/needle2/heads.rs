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

use crate::blocks::probe_pool::{probe_attention, stack_cells, to_float32, transpose_last};
use crate::blocks::weights::Tensor;
use crate::builder::{GraphBuilder, Value};
use crate::needle2::ProbeHead;

/// Upstream `probe_pool` of Needle 2: `[batch, P·d]`. `cells`: the `L+1` cells
/// `[batch, sequence, d]`; `keep`: `[batch, sequence]` int64, 1 for the row's real tokens.
fn probe_pool(b: &mut GraphBuilder, cells: &[Value], keep: &Value, probes: &Tensor) -> Value {
    let (p, d) = (probes.shape[0], probes.shape[1]);
    let rows = cells.len() as i64;
    let cells = stack_cells(b, cells, 2); // [B, S, L+1, d]
                                          // Upstream's `reshape(b, t·l, d)`: position-major, layer-minor.
    let cells = b.reshape(&cells, &[0, 1, -1, d as i64]);
    let keep = b.unsqueeze(keep, &[2]);
    let per_layer = b.const_i64(&[1, 1, rows]);
    let keep = b.op1("Expand", &[&keep, &per_layer], vec![]);
    let keep = b.reshape(&keep, &[0, 1, -1, 1]);
    let probes_t = transpose_last(&probes.data, 1, p, d);
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
    b.weight(
        "proj_t",
        &[inner, out],
        &transpose_last(&proj.data, 1, out, inner),
    )
}
