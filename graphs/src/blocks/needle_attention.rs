//! A layer's attention with the Needle ops (packed graphs, where the stock ones would run
//! `GroupQueryAttention`), for both generations: from the one projection `p` = `[q | k |
//! v | gate]`, `needle.QkvHeads` (the QKV conv, the q/k ZC-RMS norms, RoPE, padding to the
//! core's head width) writes the packed heads, `needle.Attention` attends within the
//! layer's window and appends them to the cache, and `needle.AttentionOut` unpads its
//! output, gates it by σ(gate) and projects it by the layer's `out_proj`: ~26 stock nodes
//! a layer in three (`needle.AttentionGate` and a product where `out_proj` has no codes).
//!
//! ```text
//! p ─ QkvHeads(state, taps, q/k gains, RoPE tables[, real_new]) ─ Attention(past, mask) ─ AttentionOut(p, out_proj) ─▶ [B, S, d]
//!            └▶ [next conv state, given real_new]
//! ```
//! Needle 2 has no QKV conv: its heads read `p` through a one-tap conv of ones over an
//! empty state (exact: `1 · v = v`).

use crate::blocks::attention::{
    gqa_inputs, packed_attention_core, projection, CoreInputs, KvPair, Rope,
};
use crate::blocks::context::BuildContext;
use crate::blocks::cq_matmul::attention_out_node;
use crate::blocks::norms::zc_gain;
use crate::blocks::weights::Tensor;
use crate::builder::{Attr, GraphBuilder, Value};
use crate::contract::{needle_ops, HeadShape};

/// The QKV conv the heads are read through: its state `[batch, taps − 1, q + k + v]`, taps
/// `[taps, q + k + v]` and how many of them the layer sees; with `real_new` (int64
/// `[batch, 1, 1]`, each row's real new tokens) the heads' op also gives the next state.
pub struct HeadsConv<'a> {
    pub state: &'a Value,
    pub taps: &'a Value,
    pub visible_taps: usize,
    pub real_new: Option<&'a Value>,
}

/// Whether [`needle_attention`] serves a layer: its core is `GroupQueryAttention`'s and its
/// RoPE the kernel's tables. Callers ask before they build the projection it reads.
pub fn fits(core: &CoreInputs, rope: &Rope) -> bool {
    matches!(rope, Rope::Kernel { .. }) && gqa_inputs(core).is_some()
}

/// The gated attention output through the layer's output projection `out_proj`
/// `[batch, sequence, d]` (one `needle.AttentionOut` node where it is kept as codes), the
/// present cache and the next conv state where `conv` has `real_new`, or `None`, with no
/// node built, where `core` is not `GroupQueryAttention`'s or `rope` not the kernel's
/// tables. `norms`: the q and k norms' scales (`ZCRMSNorm`: gain `1 + scale`).
#[allow(clippy::too_many_arguments)]
pub fn needle_attention<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    core: &CoreInputs,
    rope: &Rope,
    p: &Value,
    conv: HeadsConv<'_>,
    norms: [&[f32]; 2],
    past: &KvPair,
    shape: HeadShape,
    out_proj: &Tensor,
) -> Option<(Value, KvPair, Option<Value>)> {
    let Rope::Kernel {
        cos_cache,
        sin_cache,
        position_ids,
        ..
    } = rope
    else {
        return None;
    };
    gqa_inputs(core)?;
    let fused = shape.fused_dim();
    let (qkv, next_state) = b.scope("qkv_heads", |b| {
        let [q_gain, k_gain] = [("q_gain", norms[0]), ("k_gain", norms[1])]
            .map(|(name, scale)| zc_gain(b, name, scale));
        let attrs = [
            ("heads", shape.heads),
            ("kv_heads", shape.kv_heads),
            ("qk_head_dim", shape.qk_dim),
            ("v_head_dim", shape.v_dim),
            ("padded", fused),
            ("visible_taps", conv.visible_taps),
        ];
        let mut inputs = vec![
            p,
            conv.state,
            conv.taps,
            &q_gain,
            &k_gain,
            cos_cache,
            sin_cache,
            position_ids,
        ];
        inputs.extend(conv.real_new);
        let outputs = 1 + usize::from(conv.real_new.is_some());
        let mut heads = b.op_in(
            needle_ops::DOMAIN,
            needle_ops::QKV_HEADS,
            &inputs,
            ints(attrs),
            outputs,
        );
        (heads.remove(0), heads.pop())
    });
    let (out, present) = packed_attention_core(b, core, &qkv, past, shape)?;
    // The gate follows the queries', keys' and values' columns of `p`.
    let gate_at = (shape.heads + shape.kv_heads) * shape.qk_dim + shape.kv_heads * shape.v_dim;
    let attrs = ints([
        ("heads", shape.heads),
        ("head_dim", shape.v_dim),
        ("padded", fused),
        ("offset", gate_at),
    ]);
    let out = match out_proj.codes.as_deref() {
        Some(w) => b.scope("out_proj", |b| attention_out_node(b, [&out, p], w, attrs)),
        None => {
            let gated = b
                .op_in(
                    needle_ops::DOMAIN,
                    needle_ops::ATTENTION_GATE,
                    &[&out, p],
                    attrs,
                    1,
                )
                .remove(0);
            projection(b, ctx, &gated, "out_proj", out_proj)
        }
    };
    Some((out, present, next_state))
}

/// Integer attributes.
fn ints<const N: usize>(attrs: [(&'static str, usize); N]) -> Vec<(&'static str, Attr)> {
    attrs.map(|(name, v)| (name, Attr::Int(v as i64))).to_vec()
}
