//! Needle manifold hyper-connections (`_ScanBody` in `architecture.py`): the
//! residual stream is `lanes` copies `x [B,S,n,C]`. Per layer, from
//! `nx = rms_unit(x.reshape(n·C))`:
//! `h_pre = σ(a_pre·nx·φ_pre + b_pre + pre_off)`, the block input `u = Σ_n h_pre·x`;
//! `h_post = 2σ(a_post·nx·φ_post + b_post + post_off)`;
//! `h_res = Sinkhorn₂₀(a_res·nx·φ_res + b_res)` (log domain, rows then columns);
//! `x' = h_res·x + h_post ⊗ (block(u) − u)`.
//! The three projections are one MatMul whose weight has the `a_*` gains folded in (packed
//! graphs: one `needle.CqMatMul` of the layer's codes over the lanes, `rms_unit` included,
//! the gains applied to its logits).
//! Graphs with the Needle ops run each side as one node (`needle.HyperConnectionsIn`,
//! `needle.HyperConnectionsOut`); packed ones project the next layer's logits in the
//! `Out` node, from the stream it has just written.

use crate::blocks::context::{BuildContext, OpForms};
use crate::blocks::cq_matmul::cq_matmul_of_unit_rows;
use crate::blocks::cq_node::cq_node_outputs;
use crate::blocks::cq_rows::codes_and_norms;
use crate::blocks::norms::rms_unit;
use crate::blocks::weights::{CqRows, MhcWeights, Tensor};
use crate::builder::{Attr, GraphBuilder, Value};
use crate::contract::{needle_ops, MatMulWeights};

const SINKHORN_ITERS: usize = 20;

/// The mixing coefficients of one layer, computed from the stream before the block.
pub enum LaneMix {
    /// For the stock nodes: `[batch, sequence, n]` logits of `h_post` and
    /// `[batch, sequence, n·n]` of `h_res`, gains and bias applied.
    Nodes { post: Value, res: Value },
    /// For `needle.HyperConnectionsIn`/`Out` (graphs with the Needle ops): the projection's
    /// `[batch, sequence, 2n + n²]` logits and the `gains` and `bias` the ops apply.
    Kernel {
        logits: Value,
        gains: Value,
        bias: Value,
    },
}

/// Block input `u` `[batch, sequence, C]` of layer `layer` and the mixes for [`hc_post`].
/// `projected`: the layer's logits where the previous layer's [`hc_post`] projected them.
pub fn hc_pre<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    x: &Value,
    w: &MhcWeights,
    layer: usize,
    projected: Option<Value>,
) -> (Value, LaneMix) {
    let (n, c) = (ctx.common.mhc_lanes, ctx.common.d_model);
    let codes = match projected {
        Some(_) => None,
        None => packed_codes(ctx, w, layer),
    };
    // The projection's logits and the gains still to apply to them (none: folded in).
    let (logits, gains) = match (projected, codes) {
        (Some(logits), _) => (logits, Some(gains(w, layer, n))),
        // `needle.CqMatMul` reads the lanes as one row and normalises it itself.
        (None, Some(codes)) => b.scope("mhc_phi", |b| {
            let logits = cq_matmul_of_unit_rows(b, x, &codes, 2);
            (logits, Some(gains(w, layer, n)))
        }),
        (None, None) => {
            let flat = b.reshape(x, &[0, 0, (n * c) as i64]);
            let nx = rms_unit(b, ctx, &flat, n * c);
            let phi = folded_projection(w, layer, n, c);
            let phi = b.weight("mhc_phi", &[n * c, 2 * n + n * n], &phi);
            (b.matmul(&nx, &phi), None)
        }
    };
    let width = 2 * n + n * n;
    let bias = b.weight("mhc_bias", &[width], &biases(w, layer, n));
    if ctx.kernels.needle_ops {
        let gains = gains.unwrap_or_else(|| vec![1.0; width]);
        let gains = b.weight("mhc_gain", &[width], &gains);
        let u = b
            .op_in(
                needle_ops::DOMAIN,
                needle_ops::HYPER_CONNECTIONS_IN,
                &[x, &logits, &gains, &bias],
                vec![],
                1,
            )
            .remove(0);
        return (
            u,
            LaneMix::Kernel {
                logits,
                gains,
                bias,
            },
        );
    }
    let logits = match gains {
        Some(gains) => {
            let gains = b.weight("mhc_gain", &[width], &gains);
            b.mul(&logits, &gains)
        }
        None => logits,
    };
    let logits = b.add(&logits, &bias);
    let pre = b.slice(&logits, 2, 0, n as i64);
    let post = b.slice(&logits, 2, n as i64, 2 * n as i64);
    let res = b.slice(&logits, 2, 2 * n as i64, i64::MAX);
    let h_pre = b.sigmoid(&pre);
    let h_pre = b.unsqueeze(&h_pre, &[2]);
    let u = b.matmul(&h_pre, x);
    (b.squeeze(&u, &[2]), LaneMix::Nodes { post, res })
}

/// The new stream `h_res·x + h_post ⊗ (out − u)` from the block's output `out` and input
/// `u`, `[batch, sequence, C]` each; with `next` (the weights and the next layer's index)
/// in a packed graph whose next layer has its codes, also that layer's logits for its
/// [`hc_pre`], projected in the same node.
#[allow(clippy::too_many_arguments)]
pub fn hc_post<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    x: &Value,
    out: &Value,
    u: &Value,
    mix: &LaneMix,
    next: Option<(&MhcWeights, usize)>,
) -> (Value, Option<Value>) {
    let n = ctx.common.mhc_lanes as i64;
    let (post, res) = match mix {
        LaneMix::Kernel {
            logits,
            gains,
            bias,
        } => {
            let inputs = [x, out, u, logits, gains, bias];
            let iterations = vec![("iterations", Attr::Int(SINKHORN_ITERS as i64))];
            let codes = next.and_then(|(w, layer)| packed_codes(ctx, w, layer));
            let Some(codes) = codes else {
                let ty = needle_ops::HYPER_CONNECTIONS_OUT;
                let mut next = b.op_in(needle_ops::DOMAIN, ty, &inputs, iterations, 1);
                return (next.remove(0), None);
            };
            let mut outputs = b.scope("next_mhc_phi", |b| {
                let stored = codes_and_norms(b, &codes);
                let ty = needle_ops::HYPER_CONNECTIONS_OUT;
                cq_node_outputs(b, ty, &inputs, &codes, &stored, iterations, &[], 2)
            });
            let logits = outputs.pop();
            return (outputs.remove(0), logits);
        }
        LaneMix::Nodes { post, res } => (post, res),
    };
    let y = b.sub(out, u);
    let h_post = b.sigmoid(post);
    let two = b.scalar_float(2.0);
    let h_post = b.mul(&two, &h_post);
    let res = b.reshape(res, &[0, 0, n, n]);
    let h_res = match ctx.kernels.op_forms {
        OpForms::Onnx => b.scope("sinkhorn", |b| sinkhorn(b, &res)),
        OpForms::MobileAccelerators => {
            b.scope("sinkhorn", |b| sinkhorn_normalized(b, &res, n as usize))
        }
    };
    let mixed = b.matmul(&h_res, x);
    let h_post = b.unsqueeze(&h_post, &[3]);
    let y = b.unsqueeze(&y, &[2]);
    let update = b.mul(&h_post, &y);
    (b.add(&mixed, &update), None)
}

/// `exp` of 20 alternating row/column log-normalisations of `[.., n, n]` logits:
/// `x − logsumexp(x)` along an axis is `LogSoftmax`, one node per half-step, upstream's
/// arithmetic. (Working on `exp` of it with `LpNormalization(p=1)` half-steps is 0.06 ms
/// per token faster for 27 layers on the CPU, but onnxruntime 1.23 and 1.24 have no
/// opset-22 `LpNormalization` and refuse such a graph; `ReduceSum` + `Div` half-steps are
/// slower than `LogSoftmax`.)
fn sinkhorn(b: &mut GraphBuilder, logits: &Value) -> Value {
    let mut log_k = logits.clone();
    for _ in 0..SINKHORN_ITERS {
        log_k = b.op1("LogSoftmax", &[&log_k], vec![("axis", Attr::Int(-1))]);
        log_k = b.op1("LogSoftmax", &[&log_k], vec![("axis", Attr::Int(-2))]);
    }
    b.exp(&log_k)
}

/// The same 20 iterations on `exp` of the logits, for execution providers without
/// `LogSoftmax` (CoreML, NNAPI): `Softmax` is the first row step exactly; each later
/// half-step divides by the mean along its axis, which is `n` times the sum, and since
/// every step is blind to a scale, one `1/n` at the end makes it the sum's.
fn sinkhorn_normalized(b: &mut GraphBuilder, logits: &Value, n: usize) -> Value {
    let mut k = b.softmax(logits, -1);
    for step in 1..2 * SINKHORN_ITERS {
        let axis = if step % 2 == 0 { -1 } else { -2 };
        let mean = b.reduce_mean(&k, &[axis]);
        k = b.div(&k, &mean);
    }
    let n = b.scalar_float(n as f32);
    b.div(&k, &n)
}

/// The three projections of layer `layer` as one `[n·C, 2n + n²]` matrix, the `a_*` gains
/// folded into its columns.
fn folded_projection(w: &MhcWeights, layer: usize, n: usize, c: usize) -> Vec<f32> {
    let width = 2 * n + n * n;
    let nc = n * c;
    let mut phi = vec![0.0f32; nc * width];
    let gains = gains(w, layer, n);
    let parts: [(&Tensor, usize, usize); 3] = [
        (&w.phi_pre, n, 0),
        (&w.phi_post, n, n),
        (&w.phi_res, n * n, 2 * n),
    ];
    for (t, cols, at) in parts {
        for col in 0..cols {
            let row = &t.data[(layer * cols + col) * nc..(layer * cols + col + 1) * nc];
            for (i, v) in row.iter().enumerate() {
                phi[i * width + at + col] = gains[at + col] * v;
            }
        }
    }
    phi
}

/// Layer `layer`'s projection as codes, in packed graphs only (gathering a layer's rows
/// copies them).
fn packed_codes<C>(ctx: &BuildContext<C>, w: &MhcWeights, layer: usize) -> Option<CqRows> {
    match ctx.matmul_weights() {
        MatMulWeights::Packed => layer_codes(w, layer, ctx.common.mhc_lanes),
        _ => None,
    }
}

/// Layer `layer`'s rows of the three projections (`[2n + n², n·C]`) as the `.cact`'s codes,
/// when all three have them in one layout (packed graphs multiply them as stored).
fn layer_codes(w: &MhcWeights, layer: usize, n: usize) -> Option<CqRows> {
    let rows = |t: &Tensor, per_layer: usize| {
        t.codes
            .as_ref()
            .map(|c| c.row_range(layer * per_layer..(layer + 1) * per_layer))
    };
    let parts = [
        rows(&w.phi_pre, n)?,
        rows(&w.phi_post, n)?,
        rows(&w.phi_res, n * n)?,
    ];
    CqRows::stacked(&parts.iter().collect::<Vec<_>>())
}

/// The gain of each of the `2n + n²` logits: `a_pre`, `a_post`, `a_res` of the layer.
fn gains(w: &MhcWeights, layer: usize, n: usize) -> Vec<f32> {
    let counts = [n, n, n * n];
    [&w.a_pre, &w.a_post, &w.a_res]
        .iter()
        .zip(counts)
        .flat_map(|(a, count)| std::iter::repeat_n(a.data[layer], count))
        .collect()
}

/// The bias of each logit: `b_*` with the lane offsets (`pre_off`, `post_off`: the layer's
/// own lane favoured).
fn biases(w: &MhcWeights, layer: usize, n: usize) -> Vec<f32> {
    let lane = layer % n;
    let mut bias = Vec::with_capacity(2 * n + n * n);
    for i in 0..n {
        let on = if i == lane { 1.0 } else { 0.0 };
        bias.push(w.b_pre.data[layer * n + i] + (8.0 * on - 4.0));
    }
    for i in 0..n {
        let on = if i == lane { 1.0 } else { 0.0 };
        bias.push(w.b_post.data[layer * n + i] + (-4.0 * (1.0 - on)));
    }
    bias.extend_from_slice(&w.b_res.data[layer * n * n..(layer + 1) * n * n]);
    bias
}
