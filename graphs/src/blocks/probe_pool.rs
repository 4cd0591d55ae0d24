//! Upstream `probe_pool`'s attention, which both generations' probe heads pool the hidden
//! cells with (Needle 2's heads: `crate::needle2::heads`; Needle 3's confidence head:
//! `crate::needle3::confidence`), and what those heads share besides.

use crate::builder::{GraphBuilder, Value};
use crate::contract::{needle_ops, Precision};
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

/// The `cells` (each `[batch, sequence, d]`) stacked along a new `axis`, in order.
///
/// The nodes that add the axis are made last cell first. onnxruntime's default execution
/// order is a depth-first walk back from the graph's outputs that takes a node's inputs in
/// descending node order; so made, the walk reaches the embedding's cell first and then
/// each layer's cell right after that layer, and every layer's stream (`lanes` times a
/// cell) is freed once its lane mean is taken. In the other order every layer's stream
/// lives until the heads: 9.6 MB a layer for a 784-token forward of the full-size
/// Needle 3, 200 MB in all.
/// A probe head's pooling by the Needle op `op` (`needle.ProbePool`, `needle.JointProbePool`)
/// over `cells`, its `weights` inputs (`keep` first) before the running pools: from
/// `past_pools` where given, its output then the pooled value and the pools after the call;
/// else from none (a tensor of no values, the ops' convention) and the pooled value alone.
pub fn pooling_node(
    b: &mut GraphBuilder,
    op: &str,
    weights: &[&Value],
    past_pools: Option<&Value>,
    cells: &[Value],
) -> (Value, Option<Value>) {
    let no_past;
    let past = match past_pools {
        Some(past) => past,
        None => {
            no_past = b.weight("no_past_pools", &[0], &[]);
            &no_past
        }
    };
    let mut inputs = weights.to_vec();
    inputs.push(past);
    inputs.extend(cells);
    let outputs = 1 + usize::from(past_pools.is_some());
    let mut out = b.op_in(needle_ops::DOMAIN, op, &inputs, vec![], outputs);
    let present = (outputs == 2).then(|| out.remove(1));
    (out.remove(0), present)
}

pub fn stack_cells(b: &mut GraphBuilder, cells: &[Value], axis: i64) -> Value {
    let mut stacked: Vec<Value> = cells
        .iter()
        .rev()
        .map(|c| b.unsqueeze(c, &[axis]))
        .collect();
    stacked.reverse();
    let refs: Vec<&Value> = stacked.iter().collect();
    b.concat(&refs, axis)
}

/// A head's output in float32, whatever the graph's precision.
pub fn to_float32(b: &mut GraphBuilder, x: Value) -> Value {
    match b.precision() {
        Precision::Fp32 => x,
        Precision::Fp16 => b.cast(&x, data_type::FLOAT),
    }
}
