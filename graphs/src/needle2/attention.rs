//! Needle 2 `MultiHeadAttention` with a KV cache: GQA projections, q/k `ZCRMSNorm`,
//! rotate-half RoPE, the variant's attention core (`crate::blocks::attention`), sigmoid
//! output gate, `out_proj`.

use crate::blocks::attention::{
    attention_core, core_inputs, packed_projections, projection, projections, rope,
    rotate_half_rope, CoreInputs, KvPair, Rope,
};
use crate::blocks::context::BuildContext;
use crate::blocks::needle_attention::{self, needle_attention, HeadsConv};
use crate::blocks::norms::{zc_rms_norm, ZcNormed};
use crate::builder::{GraphBuilder, Value};
use crate::geometry::Geometry;
use crate::needle2::{Config, LayerWeights};

/// Position- and mask-derived inputs, built once at the top of the graph and shared by all layers.
pub struct AttentionCtx {
    pub rope: Rope,
    pub core: CoreInputs,
}

/// RoPE tables for the new positions and the core's mask inputs, built once, per row:
/// `position_ids` `[batch, sequence]` is each new token's position in its own row and
/// `mask` `[batch, total_sequence]` says which cached and new columns are real.
pub fn attention_ctx(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    mask: &Value,
    position_ids: &Value,
) -> AttentionCtx {
    let cfg = ctx.cfg;
    let rope = rope(
        b,
        ctx,
        cfg.head_dim,
        cfg.common.max_seq_len,
        cfg.common.rope_theta,
        position_ids,
    );
    let core = core_inputs(b, ctx, mask, position_ids, &[cfg.sliding_window()]).remove(0);
    AttentionCtx { rope, core }
}

/// Attention of one layer. `x`: `[batch, sequence, d_model]`; returns the
/// `[batch, sequence, d_model]` output and the present cache.
pub fn attention(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    attn: &AttentionCtx,
    x: &ZcNormed,
    w: &LayerWeights,
    past: &KvPair,
) -> (Value, KvPair) {
    if let Some(fused) = needle_ops_attention(b, ctx, attn, x, w, past) {
        return fused;
    }
    let x = &x.value(b, ctx);
    let cfg = ctx.cfg;
    let (h, kv, hd) = (
        cfg.common.num_heads as i64,
        cfg.common.num_kv_heads as i64,
        cfg.head_dim as i64,
    );
    let [q, k, v, gate]: [Value; 4] = projections(
        b,
        ctx,
        x,
        "qkv_gate_proj",
        &[&w.q_proj, &w.k_proj, &w.v_proj, &w.gate_proj],
    )
    .try_into()
    .expect("four projections");
    let q = b.reshape(&q, &[0, 0, h, hd]);
    let k = b.reshape(&k, &[0, 0, kv, hd]);
    let q = zc_rms_norm(b, ctx, &q, "q_norm", &w.q_norm.data);
    let k = zc_rms_norm(b, ctx, &k, "k_norm", &w.k_norm.data);
    let q = b.scope("q_rope", |b| {
        rotate_half_rope(b, &q, &attn.rope, cfg.common.num_heads, cfg.head_dim)
    });
    let k = b.scope("k_rope", |b| {
        rotate_half_rope(b, &k, &attn.rope, cfg.common.num_kv_heads, cfg.head_dim)
    });

    let (out, present) = attention_core(b, &attn.core, [&q, &k, &v], past, cfg.head_shape());
    let gate = b.sigmoid(&gate);
    let out = b.mul(&out, &gate);
    (projection(b, ctx, &out, "out_proj", &w.out_proj), present)
}

/// The layer's attention with the Needle ops (`crate::blocks::needle_attention`): Needle 2
/// has no QKV conv, so its heads read the projections through a one-tap conv of ones over
/// an empty state. `None`, and no node built, where the graph has no Needle ops or its core
/// and RoPE are not the kernels'.
fn needle_ops_attention(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    attn: &AttentionCtx,
    x: &ZcNormed,
    w: &LayerWeights,
    past: &KvPair,
) -> Option<(Value, KvPair)> {
    let cfg = ctx.cfg;
    if !ctx.kernels.needle_ops || !needle_attention::fits(&attn.core, &attn.rope) {
        return None;
    }
    let parts = [&w.q_proj, &w.k_proj, &w.v_proj, &w.gate_proj];
    let p = packed_projections(b, ctx, x, "qkv_gate_proj", &parts)?;
    let shape = cfg.head_shape();
    let width = (shape.heads + 2 * shape.kv_heads) * shape.qk_dim;
    let state = b.const_float(&[1, 0, width], &[]);
    let taps = b.const_float(&[1, width], &vec![1.0; width]);
    let conv = HeadsConv {
        state: &state,
        taps: &taps,
        visible_taps: 1,
        real_new: None,
    };
    let norms = [w.q_norm.data.as_slice(), w.k_norm.data.as_slice()];
    let (out, present, _) = needle_attention(
        b,
        ctx,
        &attn.core,
        &attn.rope,
        &p,
        conv,
        norms,
        past,
        shape,
        &w.out_proj,
    )?;
    Some((out, present))
}
