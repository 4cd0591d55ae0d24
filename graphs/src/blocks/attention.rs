//! What both generations' `MultiHeadAttention` are made of: the projections, rotate-half
//! RoPE, the mask inputs and the attention core over `past ++ new` keys, the one place
//! the two variants differ (each generation's block: `crate::needle2::attention`,
//! `crate::needle3::attention`). Needle 2's, for example:
//!
//! ```text
//!            ┌ q_proj ─Reshape─ q_norm ─RoPE ┐
//! x [B,S,d] ─┼ k_proj ─Reshape─ k_norm ─RoPE ┼─ core(past_k, past_v) ─ * σ(gate_proj x) ─ out_proj
//!            └ v_proj ─Reshape───────────────┘        │
//!                                                      └▶ present_k, present_v [B,KV,T,hd]
//! ```

use crate::blocks::block_quant::matmul_nbits;
use crate::blocks::context::{BuildContext, RotaryKernel};
use crate::blocks::cq_kernel::{cq_kernel, CqKernel};
use crate::blocks::cq_matmul::{cq_matmul, cq_matmul_rms_normed};
use crate::blocks::norms::{zc_gain, ZcNormed};
use crate::blocks::transpose::transpose_into;
use crate::blocks::weights::{CqRows, Tensor};
use crate::builder::{Attr, Dim, GraphBuilder, Value, MS_DOMAIN};
use crate::contract::dims::{BATCH, SEQUENCE, TOTAL_SEQUENCE};
use crate::contract::{
    needle_ops, AttentionKind, FusedOp, HeadShape, MatMulWeights, Precision, RuntimeTarget,
};
use crate::onnx::data_type;

/// How rotary embeddings are applied.
pub enum Rope {
    /// Slices and Muls (opset 21): `[batch, sequence, 1, head_dim/2]` tables of the new
    /// positions.
    Expanded { cos: Value, sin: Value },
    /// A `RotaryEmbedding` kernel (opset 23's or onnxruntime's contrib op):
    /// `[max_seq_len, head_dim/2]` caches and `[batch, sequence]` positions.
    Kernel {
        op: RotaryKernel,
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
        /// `local_window_size` as the build's onnxruntime releases count it.
        local_window: Option<usize>,
        /// The attention mask `[batch, total_sequence]` and the window's keys, which
        /// `needle.Attention` (the packed graphs' core) reads instead.
        mask: Value,
        window: Option<usize>,
    },
    /// `[batch, 1, 1, sequence, total_sequence]` bool: causal, in window, key not padding.
    Reference { visible: Value },
    /// The accelerator graphs' fixed-capacity cache (`crate::accelerator`), read whole
    /// before this call's keys: `bias` `[batch, 1, 1, sequence, capacity + sequence]`
    /// float, 0 where the query sees the key and the lowest float where not (an `Add`,
    /// since NNAPI has no `Where`). The present pair is this call's keys and values
    /// alone, which the caller writes into its cache.
    FixedCache { bias: Value },
}

/// `GroupQueryAttention`'s `local_window_size` for a window of `keys` keys, the query's own
/// among them. onnxruntime 1.24 counts the query's key in it (PR 25927); 1.20 to 1.23 count
/// only the keys before it (with `local_window_size = w` a query sees `w + 1` keys there).
fn local_window_size(keys: usize, runtime: RuntimeTarget) -> usize {
    match runtime {
        RuntimeTarget::Since1_24 => keys,
        RuntimeTarget::From1_20To1_23 => keys - 1,
    }
}

/// The cache of one layer: `[batch, num_kv_heads, past|total_sequence, head_dim]`.
pub struct KvPair {
    pub key: Value,
    pub value: Value,
}

/// The rotary tables of `head_dim`-wide heads for `position_ids`, in the form the
/// build's kernels take.
pub fn rope<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    head_dim: usize,
    max_seq_len: usize,
    theta: f32,
    position_ids: &Value,
) -> Rope {
    let (cos_table, sin_table) = rope_tables(head_dim, max_seq_len, theta);
    let half = head_dim / 2;
    let cos = b.const_float(&[max_seq_len, half], &cos_table);
    let sin = b.const_float(&[max_seq_len, half], &sin_table);
    match ctx.kernels.rotary_embedding {
        Some(op) => Rope::Kernel {
            op,
            cos_cache: cos,
            sin_cache: sin,
            position_ids: position_ids.clone(),
        },
        None => {
            let cos = b.gather(&cos, position_ids, 0);
            let sin = b.gather(&sin, position_ids, 0);
            Rope::Expanded {
                cos: b.unsqueeze(&cos, &[2]),
                sin: b.unsqueeze(&sin, &[2]),
            }
        }
    }
}

/// The core's mask-derived inputs for each of `windows` (keys within that many positions;
/// `None`: all earlier keys), the window-independent parts built once for all of them.
pub fn core_inputs<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    mask: &Value,
    position_ids: &Value,
    windows: &[Option<usize>],
) -> Vec<CoreInputs> {
    let one = b.scalar_i64(1);
    match ctx.variant.attention {
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
            windows
                .iter()
                .map(|window| CoreInputs::Fused {
                    op,
                    seqlens_k: seqlens_k.clone(),
                    total_len: total.clone(),
                    local_window: window.map(|keys| local_window_size(keys, ctx.variant.runtime)),
                    mask: mask.clone(),
                    window: *window,
                })
                .collect()
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
            let causal = b.op1("LessOrEqual", &[&k_pos, &q_pos], vec![]);
            let mut distance = None;
            let in_window: Vec<Value> = windows
                .iter()
                .map(|window| match window {
                    None => causal.clone(),
                    Some(w) => {
                        let distance = distance
                            .get_or_insert_with(|| b.sub(&q_pos, &k_pos))
                            .clone();
                        let limit = b.scalar_i64(*w as i64);
                        let recent = b.op1("Less", &[&distance, &limit], vec![]);
                        b.op1("And", &[&causal, &recent], vec![])
                    }
                })
                .collect();
            let key_valid = b.cast(mask, data_type::BOOL);
            let key_valid = b.unsqueeze(&key_valid, &[1, 2, 3]);
            let dims = [
                Dim::Named(BATCH),
                Dim::Fixed(1),
                Dim::Fixed(1),
                Dim::Named(SEQUENCE),
                Dim::Named(TOTAL_SEQUENCE),
            ];
            in_window
                .iter()
                .map(|visible| {
                    let visible = b.op1("And", &[visible, &key_valid], vec![]);
                    b.declare(&visible, data_type::BOOL, &dims);
                    CoreInputs::Reference { visible }
                })
                .collect()
        }
    }
}

/// `cos`/`sin` of `t · inv_freq` for `t < max_seq_len`, `[max_seq_len, head_dim/2]`,
/// with upstream's float32 steps: `inv_freq = 1 / θ^(2i/hd)`, angle `f32(t) · inv_freq`.
pub fn rope_tables(head_dim: usize, max_seq_len: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            1.0f32 / ((theta as f64).powf(exponent as f64) as f32)
        })
        .collect();
    let mut cos = Vec::with_capacity(max_seq_len * half);
    let mut sin = Vec::with_capacity(max_seq_len * half);
    for t in 0..max_seq_len {
        for f in &inv_freq {
            let angle = (t as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// The attention core the variant picked (the one place the variants differ): q, k, v
/// `[B,S,·]` after RoPE and the layer's cache in; output `[B,S,heads·v_dim]` and the present cache.
pub fn attention_core(
    b: &mut GraphBuilder,
    inputs: &CoreInputs,
    qkv: [&Value; 3],
    past: &KvPair,
    shape: HeadShape,
) -> (Value, KvPair) {
    match inputs {
        CoreInputs::Fused {
            op: FusedOp::GroupQueryAttention,
            seqlens_k,
            total_len,
            local_window,
            ..
        } => b.scope("gqa", |b| {
            gqa_core(b, qkv, past, seqlens_k, total_len, *local_window, shape)
        }),
        CoreInputs::Reference { visible } => {
            b.scope("sdpa", |b| reference_core(b, qkv, past, visible, shape))
        }
        CoreInputs::FixedCache { bias } => {
            b.scope("sdpa", |b| fixed_cache_core(b, qkv, past, bias, shape))
        }
    }
}

/// `x @ W^T` for a `.cact` matrix `W` stored `[out, in]`; the initializer is `[in, out]`.
pub fn projection<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    x: &Value,
    name: &str,
    w: &Tensor,
) -> Value {
    projections(b, ctx, x, name, &[w]).remove(0)
}

/// The one `needle.CqMatMul` of packed graphs over `ws` stacked (`[.., Σ out_i]`, the
/// parts in order) of the normed `x` (a deferred norm applied in the node), where they
/// share a layout; `None`, and no node built, otherwise.
pub fn packed_projections<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    x: &ZcNormed,
    name: &str,
    ws: &[&Tensor],
) -> Option<Value> {
    if ctx.matmul_weights() != MatMulWeights::Packed {
        return None;
    }
    let codes: Vec<&CqRows> = ws
        .iter()
        .map(|w| w.codes.as_deref())
        .collect::<Option<_>>()?;
    let stacked = CqRows::stacked(&codes)?;
    Some(b.scope(name, |b| match x {
        ZcNormed::Applied(h) => cq_matmul(b, h, &stacked),
        ZcNormed::Deferred { x, name, scale } => {
            let gain = zc_gain(b, &format!("{name}_gain"), scale);
            cq_matmul_rms_normed(b, x, &stacked, &gain)
        }
    }))
}

/// `x @ W_i^T` for several matrices with the same input: one MatMul over their
/// concatenation (initializer `[in, Σ out_i]`), then a Split, so `x` is read once.
/// With block-quantized MatMul weights, the concatenation is one `MatMulNBits`.
pub fn projections<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    x: &Value,
    name: &str,
    ws: &[&Tensor],
) -> Vec<Value> {
    let cols = ws[0].shape[1];
    let outs: Vec<usize> = ws.iter().map(|w| w.shape[0]).collect();
    let width: usize = outs.iter().sum();
    let storage = ctx.matmul_weights();
    if storage.is_block_quantized() {
        let rows: Vec<f32> = ws.iter().flat_map(|w| w.data.iter().copied()).collect();
        return b.scope(name, |b| {
            let y = matmul_nbits(b, storage, x, &rows, width, cols);
            split_last(b, &y, &outs)
        });
    }
    let codes: Option<Vec<&CqRows>> = ws.iter().map(|w| w.codes.as_deref()).collect();
    if let (MatMulWeights::Packed, Some(codes)) = (storage, &codes) {
        return b.scope(name, |b| match CqRows::stacked(codes) {
            Some(stacked) => {
                let y = cq_matmul(b, x, &stacked);
                split_last(b, &y, &outs)
            }
            // Parts of different widths (hand-packed files) get one product each.
            None => (0..codes.len())
                .map(|i| b.scope(i, |b| cq_matmul(b, x, codes[i])))
                .collect(),
        });
    }
    let folded = (storage == MatMulWeights::Cq)
        .then(|| codes.as_deref().and_then(CqKernel::of))
        .flatten();
    if let Some(kernel) = folded {
        return b.scope(name, |b| {
            let kernel = cq_kernel(b, "kernel", &kernel);
            let y = b.matmul(x, &kernel);
            split_last(b, &y, &outs)
        });
    }
    let mut kernel = vec![0.0; cols * width];
    let mut at = 0;
    for w in ws {
        let rows = w.shape[0];
        transpose_into(&w.data, rows, cols, &mut kernel, width, at);
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
pub fn rotate_half_rope(
    b: &mut GraphBuilder,
    x: &Value,
    rope: &Rope,
    heads: usize,
    head_dim: usize,
) -> Value {
    let width = (heads * head_dim) as i64;
    match rope {
        Rope::Kernel {
            op,
            cos_cache,
            sin_cache,
            position_ids,
        } => {
            let x = b.reshape(x, &[0, 0, width]);
            let attrs = vec![
                ("interleaved", Attr::Int(0)),
                ("num_heads", Attr::Int(heads as i64)),
            ];
            match op {
                RotaryKernel::Contrib => {
                    let ins = [&x, position_ids, cos_cache, sin_cache];
                    b.op_in(MS_DOMAIN, "RotaryEmbedding", &ins, attrs, 1)
                        .remove(0)
                }
                RotaryKernel::Onnx => {
                    let ins = [&x, cos_cache, sin_cache, position_ids];
                    b.op1("RotaryEmbedding", &ins, attrs)
                }
            }
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

/// `GroupQueryAttention` on `[B,S,N·hd]` inputs; the cache stays BNSH. With unequal
/// q/k and v widths every head is zero-padded to [`HeadShape::fused_dim`] and the score
/// scale stays `1/√qk_dim`; the output is cut back to `v_dim` per head. `local_window`:
/// the `local_window_size` attribute, as [`CoreInputs::Fused`] holds it.
fn gqa_core(
    b: &mut GraphBuilder,
    [q, k, v]: [&Value; 3],
    past: &KvPair,
    seqlens_k: &Value,
    total_len: &Value,
    local_window: Option<usize>,
    shape: HeadShape,
) -> (Value, KvPair) {
    let fused = shape.fused_dim();
    let pad = |b: &mut GraphBuilder, x: &Value, heads, dim| match dim < fused {
        true => pad_heads(b, x, heads, dim, fused),
        false => x.clone(),
    };
    let q = pad(b, q, shape.heads, shape.qk_dim);
    let k = pad(b, k, shape.kv_heads, shape.qk_dim);
    let v = pad(b, v, shape.kv_heads, shape.v_dim);
    let (out, present) = gqa_node(
        b,
        [&q, &k, &v],
        past,
        seqlens_k,
        total_len,
        local_window,
        shape,
    );
    (unpad_heads(b, &out, shape), present)
}

/// `needle.Attention`, the packed graphs' core, over query, key and value heads already padded to
/// [`HeadShape::fused_dim`] (`[B, S, (heads + 2 · kv_heads) · fused]`), its output left
/// padded (`[B, S, heads · fused]`), or `None` where `inputs` are not
/// `GroupQueryAttention`'s.
pub fn packed_attention_core(
    b: &mut GraphBuilder,
    inputs: &CoreInputs,
    qkv: &Value,
    past: &KvPair,
    shape: HeadShape,
) -> Option<(Value, KvPair)> {
    let CoreInputs::Fused {
        op: FusedOp::GroupQueryAttention,
        mask,
        window,
        ..
    } = inputs
    else {
        return None;
    };
    let fused = shape.fused_dim();
    let attrs = [
        ("heads", shape.heads),
        ("kv_heads", shape.kv_heads),
        ("head_dim", fused),
        ("qk_head_dim", shape.qk_dim),
        ("window", window.unwrap_or(0)),
    ]
    .map(|(name, v)| (name, Attr::Int(v as i64)))
    .to_vec();
    Some(b.scope("attention", |b| {
        let mut outs = b.op_in(
            needle_ops::DOMAIN,
            needle_ops::ATTENTION,
            &[qkv, &past.key, &past.value, mask],
            attrs,
            3,
        );
        let pair = KvPair {
            value: outs.pop().unwrap(),
            key: outs.pop().unwrap(),
        };
        let out = outs.pop().unwrap();
        let float = b.precision().data_type();
        let dims = [
            Dim::Named(BATCH),
            Dim::Named(SEQUENCE),
            Dim::Fixed(shape.heads * fused),
        ];
        b.declare(&out, float, &dims);
        declare_present(b, &pair, shape.kv_heads, [fused, fused]);
        (out, pair)
    }))
}

/// `GroupQueryAttention`'s `seqlens_k`, `total_len` and local window, where `inputs` are
/// its.
pub fn gqa_inputs(inputs: &CoreInputs) -> Option<(&Value, &Value, Option<usize>)> {
    match inputs {
        CoreInputs::Fused {
            op: FusedOp::GroupQueryAttention,
            seqlens_k,
            total_len,
            local_window,
            ..
        } => Some((seqlens_k, total_len, *local_window)),
        _ => None,
    }
}

/// `GroupQueryAttention` over padded heads (separate, or packed in the query with the key
/// and value absent); its output `[B, S, heads · fused]`.
fn gqa_node(
    b: &mut GraphBuilder,
    [q, k, v]: [&Value; 3],
    past: &KvPair,
    seqlens_k: &Value,
    total_len: &Value,
    local_window: Option<usize>,
    shape: HeadShape,
) -> (Value, KvPair) {
    let (h, kv) = (shape.heads as i64, shape.kv_heads as i64);
    let fused = shape.fused_dim();
    let mut attrs = vec![("num_heads", Attr::Int(h)), ("kv_num_heads", Attr::Int(kv))];
    if let Some(w) = local_window {
        attrs.push(("local_window_size", Attr::Int(w as i64)));
    }
    if shape.qk_dim < fused {
        attrs.push(("scale", Attr::Float(1.0 / (shape.qk_dim as f32).sqrt())));
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
            Dim::Fixed(shape.heads * fused),
        ],
    );
    let pair = KvPair { key, value };
    let dim = |_| fused;
    declare_present(b, &pair, shape.kv_heads, [dim(0), dim(1)]);
    (out, pair)
}

/// The core's output `[B, S, heads · fused]` cut back to `v_dim` a head.
fn unpad_heads(b: &mut GraphBuilder, out: &Value, shape: HeadShape) -> Value {
    let (h, fused) = (shape.heads as i64, shape.fused_dim());
    if shape.v_dim == fused {
        return out.clone();
    }
    let out = b.reshape(out, &[0, 0, h, fused as i64]);
    let out = b.slice(&out, 3, 0, shape.v_dim as i64);
    b.reshape(&out, &[0, 0, h * shape.v_dim as i64])
}

/// `[B,S,n·from]` heads zero-padded to `[B,S,n·to]`.
fn pad_heads(b: &mut GraphBuilder, x: &Value, n: usize, from: usize, to: usize) -> Value {
    let x = b.reshape(x, &[0, 0, n as i64, from as i64]);
    let x = b.pad_back(&x, 4, 3, (to - from) as i64);
    b.reshape(&x, &[0, 0, (n * to) as i64])
}

/// Plain scaled-dot-product attention with grouped KV heads (q, k `[B,S,N·qk]`, v `[B,S,KV·v]`):
///
/// ```text
/// q [B,S,H,qk] ─T─ [B,KV,rep,S,qk] ─MatMul(Kᵀ)─ /√qk ─Where(visible)─ Softmax ─MatMul(V)─ [B,S,H·v]
/// k,v [B,S,KV,·] ─T─ Concat(past) ─▶ present [B,KV,T,·]
/// ```
fn reference_core(
    b: &mut GraphBuilder,
    [q, k, v]: [&Value; 3],
    past: &KvPair,
    visible: &Value,
    shape: HeadShape,
) -> (Value, KvPair) {
    let new = heads_first(b, k, v, shape);
    let key = b.concat(&[&past.key, &new.key], 2);
    let value = b.concat(&[&past.value, &new.value], 2);
    let present = KvPair { key, value };
    declare_present(b, &present, shape.kv_heads, [shape.qk_dim, shape.v_dim]);
    let out = grouped_sdpa(b, q, &present, shape, |b, scores| {
        let lowest = b.scalar_float(lowest_float(b.precision()));
        b.where_(visible, scores, &lowest)
    });
    (out, present)
}

/// The reference core over a fixed-capacity cache and this call's keys (see
/// [`CoreInputs::FixedCache`]); the present pair is this call's keys and values,
/// `[batch, num_kv_heads, sequence, ·]`.
fn fixed_cache_core(
    b: &mut GraphBuilder,
    [q, k, v]: [&Value; 3],
    past: &KvPair,
    bias: &Value,
    shape: HeadShape,
) -> (Value, KvPair) {
    let new = heads_first(b, k, v, shape);
    let keys = KvPair {
        key: b.concat(&[&past.key, &new.key], 2),
        value: b.concat(&[&past.value, &new.value], 2),
    };
    let out = grouped_sdpa(b, q, &keys, shape, |b, scores| b.add(scores, bias));
    (out, new)
}

/// The lowest finite value of `precision`: a masked score, `exp` of which is 0.
pub fn lowest_float(precision: Precision) -> f32 {
    match precision {
        Precision::Fp32 => f32::MIN,
        Precision::Fp16 => -65504.0,
    }
}

/// This call's keys and values `[B,S,KV·w]` as `[B,KV,S,w]`, the cache's layout.
fn heads_first(b: &mut GraphBuilder, k: &Value, v: &Value, shape: HeadShape) -> KvPair {
    let kv = shape.kv_heads as i64;
    let k = b.reshape(k, &[0, 0, kv, shape.qk_dim as i64]);
    let v = b.reshape(v, &[0, 0, kv, shape.v_dim as i64]);
    KvPair {
        key: b.transpose(&k, &[0, 2, 1, 3]),
        value: b.transpose(&v, &[0, 2, 1, 3]),
    }
}

/// Scaled-dot-product attention of `q` `[B,S,H·qk]` over `keys` `[B,KV,T,·]`, each KV
/// head shared by `H/KV` query heads; `mask` turns the scores `[B,KV,H/KV,S,T]` into the
/// masked ones. Returns `[B,S,H·v]`.
fn grouped_sdpa(
    b: &mut GraphBuilder,
    q: &Value,
    keys: &KvPair,
    shape: HeadShape,
    mask: impl FnOnce(&mut GraphBuilder, &Value) -> Value,
) -> Value {
    let (h, kv, qk, vd) = (
        shape.heads as i64,
        shape.kv_heads as i64,
        shape.qk_dim as i64,
        shape.v_dim as i64,
    );
    let KvPair { key, value } = keys;
    let q = b.reshape(q, &[0, 0, h, qk]);
    let q = b.transpose(&q, &[0, 2, 1, 3]);
    let q = b.reshape(&q, &[0, kv, h / kv, -1, qk]);
    let float = b.precision().data_type();
    let dims = [
        Dim::Named(BATCH),
        Dim::Fixed(shape.kv_heads),
        Dim::Fixed(shape.heads / shape.kv_heads),
        Dim::Named(SEQUENCE),
        Dim::Fixed(shape.qk_dim),
    ];
    b.declare(&q, float, &dims);
    let kt = b.transpose(key, &[0, 1, 3, 2]);
    let kt = b.unsqueeze(&kt, &[2]);
    let scores = b.matmul(&q, &kt);
    let scale = b.scalar_float((shape.qk_dim as f32).sqrt());
    let scores = b.div(&scores, &scale);
    let scores = mask(b, &scores);
    let probs = b.softmax(&scores, -1);
    let v5 = b.unsqueeze(value, &[2]);
    let out = b.matmul(&probs, &v5);
    let out = b.reshape(&out, &[0, h, -1, vd]);
    let dims = [
        Dim::Named(BATCH),
        Dim::Fixed(shape.heads),
        Dim::Named(SEQUENCE),
        Dim::Fixed(shape.v_dim),
    ];
    b.declare(&out, float, &dims);
    let out = b.transpose(&out, &[0, 2, 1, 3]);
    b.reshape(&out, &[0, 0, h * vd])
}

/// `[batch, kv_heads, total_sequence, width]` on both present tensors (`[key, value]` widths).
pub(crate) fn declare_present(
    b: &mut GraphBuilder,
    present: &KvPair,
    kv_heads: usize,
    widths: [usize; 2],
) {
    let float = b.precision().data_type();
    for (t, width) in [&present.key, &present.value].into_iter().zip(widths) {
        let dims = [
            Dim::Named(BATCH),
            Dim::Fixed(kv_heads),
            Dim::Named(TOTAL_SEQUENCE),
            Dim::Fixed(width),
        ];
        b.declare(t, float, &dims);
    }
}
