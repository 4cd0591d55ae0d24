//! The Needle 3 confidence head (upstream `ConfidenceHead`: `probe_pool` over the hidden
//! cells, then `HeadProjection`), as the graph output `confidence_logit`. The cells are
//! the scaled embedding and every layer's lane mean, `[batch, sequence, L+1, d]`:
//!
//! ```text
//! scores[l,k,t] = cells[t,l]·probes[l,k] / √d   (padding: −∞)   a = softmax_t(scores)   (Needle 2's probe attention, per layer)
//! r[l,k] = rms_unit(Σ_t a·cells[t,l]) · gain[l,k]
//! u[q,(l,k)] = r[l,k]·query[q] / √d + row_bias[q,l,k]            w = softmax_(l,k)(u)
//! logit = proj · concat_q(Σ_(l,k) w·r) + bias
//! ```
//! Graphs with the Needle ops pool in one `needle.ProbePool` node that reads every cell
//! where it is (one variadic input a layer).
//!
//! The stock graphs pool over the positions of one call, so their logit is a sequence's
//! when that sequence is fed whole with an empty cache. Graphs with the Needle ops carry
//! the softmax over the tokens as running pools (`past_confidence_pools` →
//! `present_confidence_pools`), so their logit after any call is that of every token the
//! row has fed: `needle-run` reads it after the answer's last token instead of running
//! the prompt and the answer again.

use crate::blocks::context::BuildContext;
use crate::blocks::norms::rms_unit;
use crate::blocks::probe_pool::{pooling_node, probe_attention, stack_cells, to_float32};
use crate::blocks::transpose::transpose_last;
use crate::builder::{GraphBuilder, Value};
use crate::contract::needle_ops;
use crate::needle3::{Config, ProbeHead};

/// `[batch]` float32 logit, and the running pools after the call where `past_pools` are
/// given (graphs with the Needle ops). `cells`: `L+1` values `[batch, sequence, d]`;
/// `keep`: `[batch, sequence]` int64, 1 for the row's real tokens.
pub fn confidence_logit(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    cells: &[Value],
    keep: &Value,
    head: &ProbeHead,
    past_pools: Option<&Value>,
) -> (Value, Option<Value>) {
    let d = ctx.common.d_model;
    let q = head.query.shape[0];
    let (mixed, pools) = match ctx.kernels.needle_ops {
        false => (pooled_mix(b, ctx, cells, keep, head), None),
        true => {
            let weights = [
                ("probes", &head.probes),
                ("gain", &head.gain),
                ("query", &head.query),
                ("row_bias", &head.row_bias),
            ]
            .map(|(name, t)| b.weight(name, &t.shape, &t.data));
            let [probes, gain, query, row_bias] = &weights;
            let inputs = [keep, probes, gain, query, row_bias];
            pooling_node(b, needle_ops::PROBE_POOL, &inputs, past_pools, cells)
        }
    };
    // The confidence head has one output: its projection row is a vector.
    let proj = b.weight("proj", &[q * d, 1], &head.proj.data[..q * d]);
    let logit = b.matmul(&mixed, &proj);
    let bias = b.weight("bias", &[1], &head.bias.data[..1]);
    let logit = b.add(&logit, &bias);
    let logit = b.squeeze(&logit, &[1]);
    (to_float32(b, logit), pools)
}

/// Upstream `probe_pool` in stock nodes: `[batch, q · d]` from the cells `[batch, sequence,
/// d]` each.
fn pooled_mix(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    cells: &[Value],
    keep: &Value,
    head: &ProbeHead,
) -> Value {
    let d = ctx.common.d_model;
    let (rows, k) = (head.gain.shape[0], head.gain.shape[1]);
    let q = head.query.shape[0];
    let root_d = b.scalar_float((d as f32).sqrt());
    let cells = stack_cells(b, cells, 1); // [B, rows, S, d]

    let probes_t = transpose_last(&head.probes.data, rows, k, d);
    let probes_t = b.weight("probes_t", &[rows, d, k], &probes_t);
    let keep = b.unsqueeze(keep, &[1, 3]); // [B, 1, S, 1]
    let pooled = probe_attention(b, &cells, &probes_t, &keep, d); // [B, rows, k, d]
    let pooled = rms_unit(b, ctx, &pooled, d);
    let gain = b.weight("gain", &[rows, k, 1], &head.gain.data);
    let pooled = b.mul(&pooled, &gain);

    let query_t = transpose_last(&head.query.data, 1, q, d);
    let query_t = b.weight("query_t", &[d, q], &query_t);
    let u = b.matmul(&pooled, &query_t); // [B, rows, k, q]
    let u = b.div(&u, &root_d);
    let u = b.transpose(&u, &[0, 3, 1, 2]); // [B, q, rows, k]
    let row_bias = b.weight("row_bias", &head.row_bias.shape, &head.row_bias.data);
    let u = b.add(&u, &row_bias);
    let u = b.reshape(&u, &[0, q as i64, (rows * k) as i64]);
    let w = b.softmax(&u, -1);
    let flat = b.reshape(&pooled, &[0, (rows * k) as i64, d as i64]);
    let mixed = b.matmul(&w, &flat); // [B, q, d]
    b.reshape(&mixed, &[0, (q * d) as i64])
}
