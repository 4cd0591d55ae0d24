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
//! The stock graphs' heads pool over the positions of one call, so they are a sequence's
//! when it is fed whole with an empty cache. Graphs with the Needle ops pool in
//! `needle.JointProbePool` and carry the confidence head's softmax over the tokens as
//! running pools (`past_confidence_pools` → `present_confidence_pools`), so its logit
//! after any call covers every token the row has fed.

use crate::blocks::probe_pool::{pooling_node, probe_attention, stack_cells, to_float32};
use crate::blocks::transpose::transpose_last;
use crate::blocks::weights::Tensor;
use crate::builder::{GraphBuilder, Value};
use crate::contract::needle_ops;
use crate::needle2::ProbeHead;

/// Upstream `probe_pool` of Needle 2: `[batch, P·d]`, and the running pools after the
/// call where `pools` carries them. `cells`: the `L+1` cells `[batch, sequence, d]`;
/// `keep`: `[batch, sequence]` int64, 1 for the row's real tokens. Graphs with the Needle
/// ops pool in one `needle.JointProbePool` node (`Pools::Carried`: from the running pools
/// before the call; `Pools::OneCall`: this call's tokens alone).
fn probe_pool(
    b: &mut GraphBuilder,
    cells: &[Value],
    keep: &Value,
    probes: &Tensor,
    pools: Pools,
) -> (Value, Option<Value>) {
    let past = match pools {
        Pools::Stock => return (stock_probe_pool(b, cells, keep, probes), None),
        Pools::OneCall => None,
        Pools::Carried(past) => Some(past),
    };
    let probes = b.weight("probes", &probes.shape, &probes.data);
    let op = needle_ops::JOINT_PROBE_POOL;
    pooling_node(b, op, &[keep, &probes], past, cells)
}

/// How a head pools.
#[derive(Clone, Copy)]
pub enum Pools<'a> {
    /// In stock nodes, over the call's tokens.
    Stock,
    /// In the Needle op, over the call's tokens.
    OneCall,
    /// In the Needle op, from the running pools before the call (a graph input).
    Carried(&'a Value),
}

/// [`probe_pool`] in stock nodes.
fn stock_probe_pool(b: &mut GraphBuilder, cells: &[Value], keep: &Value, probes: &Tensor) -> Value {
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
    pools: Pools,
) -> Value {
    let (pooled, _) = probe_pool(b, cells, keep, &head.probes, pools);
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

/// `ConfidenceHead`: the logit `[batch]`, float32, and the running pools after the call
/// where `pools` carries them.
pub fn confidence_logit(
    b: &mut GraphBuilder,
    cells: &[Value],
    keep: &Value,
    head: &ProbeHead,
    pools: Pools,
) -> (Value, Option<Value>) {
    let (pooled, present) = probe_pool(b, cells, keep, &head.probes, pools);
    let proj_t = projection_t(b, &head.proj);
    let logit = b.matmul(&pooled, &proj_t);
    let bias = b.weight("bias", &head.bias.shape, &head.bias.data);
    let logit = b.add(&logit, &bias);
    let logit = b.squeeze(&logit, &[1]);
    (to_float32(b, logit), present)
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
