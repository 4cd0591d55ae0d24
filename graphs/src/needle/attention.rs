//! Needle `MultiHeadAttention` with a KV cache: GQA projections, q/k `ZCRMSNorm`,
//! rotate-half RoPE, attention over `past ++ new` keys, sigmoid output gate, `out_proj`.
//! Only the attention core differs between the two variants:
//!
//! ```text
//!            ┌ q_proj ─Reshape─ q_norm ─RoPE ┐
//! x [B,S,d] ─┼ k_proj ─Reshape─ k_norm ─RoPE ┼─ core(past_k, past_v) ─ * σ(gate_proj x) ─ out_proj
//!            └ v_proj ─Reshape───────────────┘        │
//!                                                      └▶ present_k, present_v [B,KV,T,hd]
//! ```

use crate::builder::{Attr, Dim, GraphBuilder, Value, MS_DOMAIN};
use crate::contract::dims::{BATCH, SEQUENCE, TOTAL_SEQUENCE};
use crate::contract::{AttentionKind, FusedOp, MatMulWeights, Precision};
use crate::needle::block_quant::matmul_nbits;
use crate::needle::norms::zc_rms_norm;
use crate::needle::{BuildContext, Config, LayerWeights, Tensor};
use crate::onnx::data_type;

/// Position- and mask-derived inputs, built once at the top of the graph and shared by all layers.
pub struct AttentionCtx {
    pub rope: Rope,
    pub core: CoreInputs,
}

/// How rotary embeddings are applied.
pub enum Rope {
    /// Slices and Muls (opset 21): `[batch, sequence, 1, head_dim/2]` tables of the new
    /// positions.
    Expanded { cos: Value, sin: Value },
    /// The opset-23 `RotaryEmbedding` kernel: `[max_seq_len, head_dim/2]` caches and
    /// `[batch, sequence]` positions.
    Kernel {
        cos_cache: Value,
        sin_cache: Value,
        position_ids: Value,
    },
}

/// What the chosen core needs besides q, k, v and the past.
pub enum CoreInputs {
    /// `seqlens_k` `[batch]` int32 (valid keys − 1), `total_sequence_length` int32 scalar.
    Fused {
        op: FusedOp,
        seqlens_k: Value,
        total_len: Value,
        local_window: Option<usize>,
    },
    /// `[batch, 1, 1, sequence, total_sequence]` bool: causal, in window, key not padding.
    Reference { visible: Value },
}

/// The cache of one layer: `[batch, num_kv_heads, past|total_sequence, head_dim]`.
pub struct KvPair {
    pub key: Value,
    pub value: Value,
}

/// RoPE tables for the new positions and the core's mask inputs, built once, per row:
/// `position_ids` `[batch, sequence]` is each new token's position in its own row and
/// `mask` `[batch, total_sequence]` says which cached and new columns are real.
pub fn attention_ctx(
    b: &mut GraphBuilder,
    ctx: &BuildContext,
    mask: &Value,
    position_ids: &Value,
) -> AttentionCtx {
    let cfg = ctx.cfg;
    let (cos_table, sin_table) = rope_tables(cfg);
    let half = cfg.head_dim / 2;
    let cos = b.const_float(&[cfg.max_seq_len, half], &cos_table);
    let sin = b.const_float(&[cfg.max_seq_len, half], &sin_table);
    let rope = if ctx.kernels.rotary_embedding {
        Rope::Kernel {
            cos_cache: cos,
            sin_cache: sin,
            position_ids: position_ids.clone(),
        }
    } else {
        let cos = b.gather(&cos, position_ids, 0);
        let sin = b.gather(&sin, position_ids, 0);
        Rope::Expanded {
            cos: b.unsqueeze(&cos, &[2]),
            sin: b.unsqueeze(&sin, &[2]),
        }
    };
    let window = effective_window(cfg);
    let one = b.scalar_i64(1);
    let core = match ctx.variant.attention {
        AttentionKind::Fused(op) => {
            // GroupQueryAttention keeps each row's keys packed from slot 0, so only the
            // count of real columns matters. An all-padding row would give -1, which the
            // kernel rejects; it attends to its first slot instead (finite, ignored).
            let valid = b.reduce_sum(mask, &[1], false);
            let last = b.sub(&valid, &one);
            let zero = b.scalar_i64(0);
            let last = b.op1("Max", &[&last, &zero], vec![]);
            let seqlens_k = b.cast(&last, data_type::INT32);
            let total = b.shape_of(mask, 1, 2);
            let total = b.squeeze(&total, &[0]);
            let total = b.cast(&total, data_type::INT32);
            CoreInputs::Fused {
                op,
                seqlens_k,
                total_len: total,
                local_window: window,
            }
        }
        AttentionKind::Reference => {
            // A real key's position in its row is the count of real columns before it.
            let axis = b.scalar_i64(1);
            let counted = b.op1("CumSum", &[mask, &axis], vec![]);
            let key_pos = b.sub(&counted, &one);
            b.declare(
                &key_pos,
                data_type::INT64,
                &[Dim::Named(BATCH), Dim::Named(TOTAL_SEQUENCE)],
            );
            let k_pos = b.unsqueeze(&key_pos, &[1, 2, 3]);
            let q_pos = b.unsqueeze(position_ids, &[1, 2, 4]);
            let mut visible = b.op1("LessOrEqual", &[&k_pos, &q_pos], vec![]);
            if let Some(w) = window {
                let distance = b.sub(&q_pos, &k_pos);
                let limit = b.scalar_i64(w as i64);
                let recent = b.op1("Less", &[&distance, &limit], vec![]);
                visible = b.op1("And", &[&visible, &recent], vec![]);
            }
            let key_valid = b.cast(mask, data_type::BOOL);
            let key_valid = b.unsqueeze(&key_valid, &[1, 2, 3]);
            let visible = b.op1("And", &[&visible, &key_valid], vec![]);
            let dims = [
                Dim::Named(BATCH),
                Dim::Fixed(1),
                Dim::Fixed(1),
                Dim::Named(SEQUENCE),
                Dim::Named(TOTAL_SEQUENCE),
            ];
            b.declare(&visible, data_type::BOOL, &dims);
            CoreInputs::Reference { visible }
        }
    };
    AttentionCtx { rope, core }
}

/// The sliding window when it can bind (shorter than `max_seq_len`).
fn effective_window(cfg: &Config) -> Option<usize> {
    (cfg.kv_window > 0 && cfg.kv_window < cfg.max_seq_len).then_some(cfg.kv_window)
}

/// `cos`/`sin` of `t · inv_freq` for `t < max_seq_len`, `[max_seq_len, head_dim/2]`,
/// with upstream's float32 steps: `inv_freq = 1 / θ^(2i/hd)`, angle `f32(t) · inv_freq`.
pub fn rope_tables(cfg: &Config) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = (2 * i) as f32 / cfg.head_dim as f32;
            1.0f32 / ((cfg.rope_theta as f64).powf(exponent as f64) as f32)
        })
        .collect();
    let mut cos = Vec::with_capacity(cfg.max_seq_len * half);
    let mut sin = Vec::with_capacity(cfg.max_seq_len * half);
    for t in 0..cfg.max_seq_len {
        for f in &inv_freq {
            let angle = (t as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Attention of one layer. `x`: `[batch, sequence, d_model]`; returns the
/// `[batch, sequence, d_model]` output and the present cache.
pub fn attention(
    b: &mut GraphBuilder,
    ctx: &BuildContext,
    attn: &AttentionCtx,
    x: &Value,
    w: &LayerWeights,
    past: &KvPair,
) -> (Value, KvPair) {
    let cfg = ctx.cfg;
    let (h, kv, hd) = (
        cfg.num_heads as i64,
        cfg.num_kv_heads as i64,
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
        rotate_half_rope(b, &q, &attn.rope, cfg.num_heads, cfg.head_dim)
    });
    let k = b.scope("k_rope", |b| {
        rotate_half_rope(b, &k, &attn.rope, cfg.num_kv_heads, cfg.head_dim)
    });

    let (out, present) = match &attn.core {
        CoreInputs::Fused {
            op: FusedOp::GroupQueryAttention,
            seqlens_k,
            total_len,
            local_window,
        } => b.scope("gqa", |b| {
            gqa_core(
                b,
                [&q, &k, &v],
                past,
                seqlens_k,
                total_len,
                *local_window,
                cfg,
            )
        }),
        CoreInputs::Reference { visible } => b.scope("sdpa", |b| {
            reference_core(b, [&q, &k, &v], past, visible, cfg)
        }),
    };
    let gate = b.sigmoid(&gate);
    let out = b.mul(&out, &gate);
    (projection(b, ctx, &out, "out_proj", &w.out_proj), present)
}

/// `x @ W^T` for a `.cact` matrix `W` stored `[out, in]`; the initializer is `[in, out]`.
pub fn projection(
    b: &mut GraphBuilder,
    ctx: &BuildContext,
    x: &Value,
    name: &str,
    w: &Tensor,
) -> Value {
    projections(b, ctx, x, name, &[w]).remove(0)
}

/// `x @ W_i^T` for several matrices with the same input: one MatMul over their
/// concatenation (initializer `[in, Σ out_i]`), then a Split, so `x` is read once.
/// With block-quantized MatMul weights, the concatenation is one `MatMulNBits`.
pub fn projections(
    b: &mut GraphBuilder,
    ctx: &BuildContext,
    x: &Value,
    name: &str,
    ws: &[&Tensor],
) -> Vec<Value> {
    let cols = ws[0].shape[1];
    let outs: Vec<usize> = ws.iter().map(|w| w.shape[0]).collect();
    let width: usize = outs.iter().sum();
    let storage = ctx.matmul_weights();
    if storage != MatMulWeights::Float {
        let rows: Vec<f32> = ws.iter().flat_map(|w| w.data.iter().copied()).collect();
        return b.scope(name, |b| {
            let y = matmul_nbits(b, storage, x, &rows, width, cols);
            split_last(b, &y, &outs)
        });
    }
    let mut kernel = vec![0.0; cols * width];
    let mut at = 0;
    for w in ws {
        let rows = w.shape[0];
        for r in 0..rows {
            for c in 0..cols {
                kernel[c * width + at + r] = w.data[r * cols + c];
            }
        }
        at += rows;
    }
    b.scope(name, |b| {
        let kernel = b.weight("kernel", &[cols, width], &kernel);
        let y = b.matmul(x, &kernel);
        split_last(b, &y, &outs)
    })
}

/// `y` split along its last axis into parts of `sizes` (no node for one part).
fn split_last(b: &mut GraphBuilder, y: &Value, sizes: &[usize]) -> Vec<Value> {
    if sizes.len() == 1 {
        return vec![y.clone()];
    }
    let s: Vec<i64> = sizes.iter().map(|&o| o as i64).collect();
    let s = b.const_i64(&s);
    b.op(
        "Split",
        &[y, &s],
        vec![("axis", Attr::Int(-1))],
        sizes.len(),
    )
}

/// `[x1·cos − x2·sin, x2·cos + x1·sin]` over the halves of each head of `[B,S,N,hd]`;
/// returns `[B,S,N·hd]`.
fn rotate_half_rope(
    b: &mut GraphBuilder,
    x: &Value,
    rope: &Rope,
    heads: usize,
    head_dim: usize,
) -> Value {
    let width = (heads * head_dim) as i64;
    match rope {
        Rope::Kernel {
            cos_cache,
            sin_cache,
            position_ids,
        } => {
            let x = b.reshape(x, &[0, 0, width]);
            let attrs = vec![
                ("interleaved", Attr::Int(0)),
                ("num_heads", Attr::Int(heads as i64)),
            ];
            b.op1(
                "RotaryEmbedding",
                &[&x, cos_cache, sin_cache, position_ids],
                attrs,
            )
        }
        Rope::Expanded { cos, sin } => {
            let half = (head_dim / 2) as i64;
            let x1 = b.slice(x, 3, 0, half);
            let x2 = b.slice(x, 3, half, i64::MAX);
            let a = b.mul(&x1, cos);
            let c = b.mul(&x2, sin);
            let r1 = b.sub(&a, &c);
            let a = b.mul(&x2, cos);
            let c = b.mul(&x1, sin);
            let r2 = b.add(&a, &c);
            let r = b.concat(&[&r1, &r2], 3);
            b.reshape(&r, &[0, 0, width])
        }
    }
}

/// `GroupQueryAttention` on `[B,S,N·hd]` inputs; the cache stays BNSH.
fn gqa_core(
    b: &mut GraphBuilder,
    [q, k, v]: [&Value; 3],
    past: &KvPair,
    seqlens_k: &Value,
    total_len: &Value,
    local_window: Option<usize>,
    cfg: &Config,
) -> (Value, KvPair) {
    let (h, kv) = (cfg.num_heads as i64, cfg.num_kv_heads as i64);
    let mut attrs = vec![("num_heads", Attr::Int(h)), ("kv_num_heads", Attr::Int(kv))];
    if let Some(w) = local_window {
        attrs.push(("local_window_size", Attr::Int(w as i64)));
    }
    let mut outs = b.op_in(
        MS_DOMAIN,
        "GroupQueryAttention",
        &[q, k, v, &past.key, &past.value, seqlens_k, total_len],
        attrs,
        3,
    );
    let value = outs.pop().unwrap();
    let key = outs.pop().unwrap();
    let out = outs.pop().unwrap();
    let float = b.precision().data_type();
    b.declare(
        &out,
        float,
        &[
            Dim::Named(BATCH),
            Dim::Named(SEQUENCE),
            Dim::Fixed(cfg.num_heads * cfg.head_dim),
        ],
    );
    let pair = KvPair { key, value };
    declare_present(b, &pair, cfg);
    (out, pair)
}

/// Plain scaled-dot-product attention with grouped KV heads (q, k, v `[B,S,N·hd]`):
///
/// ```text
/// q [B,S,H,hd] ─T─ [B,KV,rep,S,hd] ─MatMul(Kᵀ)─ /√hd ─Where(visible)─ Softmax ─MatMul(V)─ [B,S,H·hd]
/// k,v [B,S,KV,hd] ─T─ Concat(past) ─▶ present [B,KV,T,hd]
/// ```
fn reference_core(
    b: &mut GraphBuilder,
    [q, k, v]: [&Value; 3],
    past: &KvPair,
    visible: &Value,
    cfg: &Config,
) -> (Value, KvPair) {
    let (h, kv, hd) = (
        cfg.num_heads as i64,
        cfg.num_kv_heads as i64,
        cfg.head_dim as i64,
    );
    let k = b.reshape(k, &[0, 0, kv, hd]);
    let v = b.reshape(v, &[0, 0, kv, hd]);
    let k_new = b.transpose(&k, &[0, 2, 1, 3]);
    let v_new = b.transpose(&v, &[0, 2, 1, 3]);
    let key = b.concat(&[&past.key, &k_new], 2);
    let value = b.concat(&[&past.value, &v_new], 2);
    let present = KvPair { key, value };
    declare_present(b, &present, cfg);
    let KvPair { key, value } = present;

    let q = b.reshape(q, &[0, 0, h, hd]);
    let q = b.transpose(&q, &[0, 2, 1, 3]);
    let q = b.reshape(&q, &[0, kv, h / kv, -1, hd]);
    let float = b.precision().data_type();
    let dims = [
        Dim::Named(BATCH),
        Dim::Fixed(cfg.num_kv_heads),
        Dim::Fixed(cfg.num_heads / cfg.num_kv_heads),
        Dim::Named(SEQUENCE),
        Dim::Fixed(cfg.head_dim),
    ];
    b.declare(&q, float, &dims);
    let kt = b.transpose(&key, &[0, 1, 3, 2]);
    let kt = b.unsqueeze(&kt, &[2]);
    let scores = b.matmul(&q, &kt);
    let scale = b.scalar_float((cfg.head_dim as f32).sqrt());
    let scores = b.div(&scores, &scale);
    let lowest = b.scalar_float(match b.precision() {
        Precision::Fp32 => f32::MIN,
        Precision::Fp16 => -65504.0,
    });
    let scores = b.where_(visible, &scores, &lowest);
    let probs = b.softmax(&scores, -1);
    let v5 = b.unsqueeze(&value, &[2]);
    let out = b.matmul(&probs, &v5);
    let out = b.reshape(&out, &[0, h, -1, hd]);
    let dims = [
        Dim::Named(BATCH),
        Dim::Fixed(cfg.num_heads),
        Dim::Named(SEQUENCE),
        Dim::Fixed(cfg.head_dim),
    ];
    b.declare(&out, float, &dims);
    let out = b.transpose(&out, &[0, 2, 1, 3]);
    let out = b.reshape(&out, &[0, 0, h * hd]);
    (out, KvPair { key, value })
}

/// `[batch, num_kv_heads, total_sequence, head_dim]` on both present tensors.
fn declare_present(b: &mut GraphBuilder, present: &KvPair, cfg: &Config) {
    let float = b.precision().data_type();
    let dims = [
        Dim::Named(BATCH),
        Dim::Fixed(cfg.num_kv_heads),
        Dim::Named(TOTAL_SEQUENCE),
        Dim::Fixed(cfg.head_dim),
    ];
    b.declare(&present.key, float, &dims);
    b.declare(&present.value, float, &dims);
}
