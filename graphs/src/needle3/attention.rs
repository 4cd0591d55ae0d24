//! Needle 3 `MultiHeadAttention`: Needle 2's (projections, q/k `ZCRMSNorm`, RoPE,
//! GQA core, sigmoid gate, `out_proj`) with split head widths (`qk_head_dim` for queries
//! and keys, `v_head_dim` for values), a causal depthwise conv over the raw Q, K and V
//! projections, and a per-layer window (local layers see `sliding_window` keys).
//!
//! ```text
//!            ┌ q_proj ┐                 ┌ Reshape ─ q_norm ─ RoPE ┐
//! x [B,S,d] ─┼ k_proj ┼─ conv(state) ───┼ Reshape ─ k_norm ─ RoPE ┼─ core(past, window) ─ * σ(gate_proj x) ─ out_proj
//!            └ v_proj ┘      │           └─────────────────────────┘
//!                            └▶ next conv state [B, taps−1, q+k+v]
//! conv: y_t = Σ_j taps_j · p_{t−j} over each row's real projections, zeros before its start
//! ```

use crate::blocks::attention::{
    attention_core, packed_projections, projection, projections, rotate_half_rope, CoreInputs,
    KvPair, Rope,
};
use crate::blocks::context::BuildContext;
use crate::blocks::needle_attention::{self, needle_attention, HeadsConv};
use crate::blocks::norms::{zc_rms_norm, ZcNormed};
use crate::builder::{Attr, Dim, GraphBuilder, Value};
use crate::contract::dims::BATCH;
use crate::contract::Precision;
use crate::geometry::Geometry;
use crate::needle3::{Config, LayerWeights, QkvTaps};
use crate::onnx::data_type;

/// What every layer's attention reads besides its input, built once at the top.
pub struct AttentionCtx {
    pub rope: Rope,
    /// The core inputs of global layers.
    pub global: CoreInputs,
    /// The core inputs of local layers, when any layer is local.
    pub local: Option<CoreInputs>,
    /// `[batch, 1, 1]` int64: each row's real new tokens, to pick the next conv state;
    /// `None` where the caller keeps the state (the accelerator graphs, which return the
    /// raw projections of this call instead).
    pub real_new: Option<Value>,
}

impl AttentionCtx {
    /// The core inputs of layer `layer`: its window's where it is local.
    fn core(&self, cfg: &Config, layer: usize) -> &CoreInputs {
        match (&self.local, cfg.is_local(layer)) {
            (Some(local), true) => local,
            _ => &self.global,
        }
    }
}

/// One layer's state in: its KV cache and, when the model has the conv, its QKV-conv state.
pub struct LayerPast<'a> {
    pub kv: &'a KvPair,
    pub conv: Option<&'a Value>,
}

/// Attention of layer `layer`. Returns the output, the present cache and the next conv
/// state.
pub fn attention(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    attn: &AttentionCtx,
    layer: usize,
    x: &ZcNormed,
    w: &LayerWeights,
    past: LayerPast<'_>,
) -> (Value, KvPair, Option<Value>) {
    let cfg = ctx.cfg;
    if let Some(fused) = needle_ops_attention(b, ctx, attn, layer, x, w, &past) {
        return fused;
    }
    let x = &x.value(b, ctx);
    let shape = cfg.head_shape();
    let (h, kv) = (cfg.common.num_heads as i64, cfg.common.num_kv_heads as i64);
    let qk = cfg.qk_head_dim as i64;
    let [q, k, v, gate]: [Value; 4] = projections(
        b,
        ctx,
        x,
        "qkv_gate_proj",
        &[&w.q_proj, &w.k_proj, &w.v_proj, &w.gate_proj],
    )
    .try_into()
    .expect("four projections");
    let (q, k, v, next_conv) = match (&w.qkv_taps, past.conv) {
        (Some(taps), Some(state)) => {
            let (q, k, v, next) = b.scope("qkv_conv", |b| {
                qkv_conv(
                    b,
                    ctx,
                    layer,
                    [&q, &k, &v],
                    taps,
                    state,
                    attn.real_new.as_ref(),
                )
            });
            (q, k, v, Some(next))
        }
        _ => (q, k, v, None),
    };
    let q = b.reshape(&q, &[0, 0, h, qk]);
    let k = b.reshape(&k, &[0, 0, kv, qk]);
    let q = zc_rms_norm(b, ctx, &q, "q_norm", &w.q_norm.data);
    let k = zc_rms_norm(b, ctx, &k, "k_norm", &w.k_norm.data);
    let q = b.scope("q_rope", |b| {
        rotate_half_rope(b, &q, &attn.rope, cfg.common.num_heads, cfg.qk_head_dim)
    });
    let k = b.scope("k_rope", |b| {
        rotate_half_rope(b, &k, &attn.rope, cfg.common.num_kv_heads, cfg.qk_head_dim)
    });
    let (out, present) = attention_core(b, attn.core(cfg, layer), [&q, &k, &v], past.kv, shape);
    let gate = b.sigmoid(&gate);
    let out = b.mul(&out, &gate);
    (
        projection(b, ctx, &out, "out_proj", &w.out_proj),
        present,
        next_conv,
    )
}

/// The causal depthwise conv over `[q, k, v]` (`[batch, sequence, ·]` each), reading
/// the previous positions from `state` `[batch, taps−1, q+k+v]`; returns the convolved
/// q, k, v and the next state: each row's last `taps−1` real positions with `real_new`,
/// this call's raw projections `[batch, sequence, q+k+v]` without. A local layer whose
/// window is narrower than the conv drops the taps it cannot see.
fn qkv_conv(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    layer: usize,
    [q, k, v]: [&Value; 3],
    taps: &QkvTaps,
    state: &Value,
    real_new: Option<&Value>,
) -> (Value, Value, Value, Value) {
    let cfg = ctx.cfg;
    let n = cfg.qkv_conv_taps;
    let width = cfg.qkv_width();
    let (qd, kd) = (taps.q.shape[1], taps.k.shape[1]);
    let weights = conv_taps(taps, n, width);
    // The state is float32 in every precision (the fp16 projections convert exactly).
    let float = b.precision().data_type();
    let state = match b.precision() {
        Precision::Fp32 => state.clone(),
        Precision::Fp16 => b.cast(state, float),
    };
    let raw = b.concat(&[q, k, v], 2);
    let window = b.concat(&[&state, &raw], 1);
    let weights = b.weight("taps", &[n, width], &weights);
    let visible = cfg.window_of(layer).unwrap_or(usize::MAX);
    let mut sum: Option<Value> = None;
    for j in 0..n.min(visible) {
        // Position t of the chunk is window row t + n − 1; tap j reads row t + n − 1 − j.
        let start = (n - 1 - j) as i64;
        let end = if j == 0 { i64::MAX } else { -(j as i64) };
        let shifted = b.slice(&window, 1, start, end);
        let index = b.scalar_i64(j as i64);
        let tap = b.gather(&weights, &index, 0);
        let term = b.mul(&tap, &shifted);
        sum = Some(match sum {
            None => term,
            Some(acc) => b.add(&acc, &term),
        });
    }
    let conv = sum.expect("a conv has at least one tap");
    let sizes = b.const_i64(&[qd as i64, kd as i64, (width - qd - kd) as i64]);
    let mut parts = b.op("Split", &[&conv, &sizes], vec![("axis", Attr::Int(2))], 3);
    let v = parts.pop().unwrap();
    let k = parts.pop().unwrap();
    let q = parts.pop().unwrap();
    let Some(real_new) = real_new else {
        return (q, k, v, raw);
    };
    let next = next_conv_state(b, &window, real_new, n, width);
    (q, k, v, next)
}

/// Each row's last `taps − 1` real rows of the conv's `window` (`[batch, taps − 1 + sequence,
/// width]`): they start at row `real_new` (right padding), as float32.
fn next_conv_state(
    b: &mut GraphBuilder,
    window: &Value,
    real_new: &Value,
    n: usize,
    width: usize,
) -> Value {
    // A row's real new positions are its chunk's first columns (right padding), so its
    // last n − 1 real rows of the window start at row `real_new`.
    let rows = b.const_i64(&(0..(n - 1) as i64).collect::<Vec<_>>());
    let rows = b.reshape(&rows, &[1, (n - 1) as i64, 1]);
    let rows = b.add(real_new, &rows);
    let full = b.const_i64(&[1, 1, width as i64]);
    let index = b.op1("Expand", &[&rows, &full], vec![]);
    let next = b.op1(
        "GatherElements",
        &[window, &index],
        vec![("axis", Attr::Int(1))],
    );
    let next = match b.precision() {
        Precision::Fp32 => next,
        Precision::Fp16 => b.cast(&next, data_type::FLOAT),
    };
    declare_conv_state(b, &next, n, width);
    next
}

/// Declares `next` the conv state it is: float32 `[batch, taps − 1, width]`.
fn declare_conv_state(b: &mut GraphBuilder, next: &Value, n: usize, width: usize) {
    let dims = [Dim::Named(BATCH), Dim::Fixed(n - 1), Dim::Fixed(width)];
    b.declare(next, data_type::FLOAT, &dims);
}

/// The conv's taps `[taps, q + k + v]`, each tap's q, k and v columns side by side.
fn conv_taps(taps: &QkvTaps, n: usize, width: usize) -> Vec<f32> {
    let (qd, kd) = (taps.q.shape[1], taps.k.shape[1]);
    let vd = width - qd - kd;
    let mut weights = Vec::with_capacity(n * width);
    for j in 0..n {
        weights.extend_from_slice(&taps.q.data[j * qd..(j + 1) * qd]);
        weights.extend_from_slice(&taps.k.data[j * kd..(j + 1) * kd]);
        weights.extend_from_slice(&taps.v.data[j * vd..(j + 1) * vd]);
    }
    weights
}

/// The layer's attention with the Needle ops (`crate::blocks::needle_attention`, a model
/// with the QKV conv): the one projection, `needle.QkvHeads` through the conv (which also
/// gives the next conv state), the core and `needle.AttentionGate`. `None`, and no
/// node built, where any of that does not hold.
fn needle_ops_attention(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    attn: &AttentionCtx,
    layer: usize,
    x: &ZcNormed,
    w: &LayerWeights,
    past: &LayerPast<'_>,
) -> Option<(Value, KvPair, Option<Value>)> {
    let cfg = ctx.cfg;
    let (taps, state, real_new) = (w.qkv_taps.as_ref()?, past.conv?, attn.real_new.as_ref()?);
    let core = attn.core(cfg, layer);
    if !ctx.kernels.needle_ops || !needle_attention::fits(core, &attn.rope) {
        return None;
    }
    let parts = [&w.q_proj, &w.k_proj, &w.v_proj, &w.gate_proj];
    let p = packed_projections(b, ctx, x, "qkv_gate_proj", &parts)?;
    let (n, width) = (cfg.qkv_conv_taps, cfg.qkv_width());
    let taps = b.weight("taps", &[n, width], &conv_taps(taps, n, width));
    let conv = HeadsConv {
        state,
        taps: &taps,
        visible_taps: n.min(cfg.window_of(layer).unwrap_or(usize::MAX)),
        real_new: Some(real_new),
    };
    let norms = [w.q_norm.data.as_slice(), w.k_norm.data.as_slice()];
    let shape = cfg.head_shape();
    let (out, present, next) = needle_attention(
        b,
        ctx,
        core,
        &attn.rope,
        &p,
        conv,
        norms,
        past.kv,
        shape,
        &w.out_proj,
    )?;
    let next = next.expect("real_new was given");
    declare_conv_state(b, &next, n, width);
    Some((out, present, Some(next)))
}
