//! `SimpleAttentionNetwork.__call__` with a KV cache, from `input_ids` to `logits`:
//!
//! ```text
//! input_ids ─Gather(embedding)·√d─ Expand(n lanes) ─┬─ layer 0 … layer L−1 ─ mean(lanes) ─ final_norm ─ ·embeddingᵀ ─▶ logits
//!                                                    │   hc_pre → [engram] → block → hc_post
//!             [probe heads] x0 and each layer's lane mean ─ probe_pool ─▶ contrastive_embedding, confidence_logit
//! token history ++ input_ids ─ engram hash ──────────┘ (engram sites only)
//! input_ids ─ written into the token history (one more cache pair) ─▶ present.{L}
//! position_ids, attention_mask ─ RoPE, attention masks, engram validity (per row)
//! ```
//!
//! One function per stage: [`inputs`], [`embed_tokens`], [`layer`] (and its [`block`]),
//! [`lm_head`], [`outputs`]; the probe heads are in [`crate::needle::probe_heads`]. The
//! names they read and write are the contract's.

use crate::builder::{Dim, GraphBuilder, Value};
use crate::contract::dims::{BATCH, PAST_SEQUENCE, SEQUENCE, TOTAL_SEQUENCE};
use crate::contract::names::{self, layer_cache};
use crate::contract::{AttentionKind, ExportDescription, MatMulWeights, Precision};
use crate::needle::attention::{attention, attention_ctx, AttentionCtx, HeadShape, KvPair};
use crate::needle::block_quant::{gather_table, matmul_nbits};
use crate::needle::cq_kernel::{cq_kernel, CqKernel};
use crate::needle::engram::{self, EngramKv, EngramWindow};
use crate::needle::hadamard_mlp::hadamard_mlp;
use crate::needle::hyper_connections::{hc_post, hc_pre};
use crate::needle::norms::zc_rms_norm;
use crate::needle::probe_heads::{confidence_logit, contrastive_embedding};
use crate::needle::token_history;
use crate::needle::{BuildContext, Config, LayerWeights, Tensor, Weights};
use crate::onnx::{data_type, ModelProto};

/// Builds the graph `desc` describes, with `desc`'s metadata in `metadata_props`.
/// The fused variant is onnxruntime's fast path (single-kernel norms and RoPE,
/// `GroupQueryAttention`); the reference variant stays on opset-21 primitives so that any
/// runtime and execution provider takes all of it (see [`BuildContext`]).
pub fn build(desc: &ExportDescription, cfg: &Config, w: &Weights) -> ModelProto {
    let ctx = BuildContext::new(cfg, desc.variant);
    let mut b = GraphBuilder::new(ctx.kernels.opset(), desc.variant.precision);
    let inputs = inputs(&mut b, &ctx);
    let masks = b.scope("new_mask", |b| {
        split_mask(b, &inputs.mask, &inputs.input_ids)
    });
    let attn = b.scope("attn_ctx", |b| {
        attention_ctx(b, &ctx, &inputs.mask, &inputs.position_ids)
    });
    let history = &inputs.pasts[cfg.num_layers];
    let window = engram_window(
        &mut b,
        &ctx,
        history,
        &masks,
        &inputs.input_ids,
        &inputs.position_ids,
    );
    let engram_kv = engram::site_kvs(&mut b, &ctx, &w.engrams, &window);

    let (embedding, mut x) = b.scope("embed_tokens", |b| {
        embed_tokens(b, &ctx, &w.embedding, &inputs.input_ids)
    });
    // The probe heads' cells (upstream `hidden_cells`): the scaled embedding (one lane of
    // the stream, exactly), then each layer's lane mean.
    let has_heads = w.contrastive.is_some() || w.confidence.is_some();
    let mut cells = Vec::new();
    if has_heads {
        let x0 = b.slice(&x, 2, 0, 1);
        cells.push(b.squeeze(&x0, &[2]));
    }
    let shared = LayerInputs {
        attn,
        engram_kv,
        pasts: &inputs.pasts,
    };
    let mut presents = Vec::with_capacity(w.layers.len());
    for i in 0..w.layers.len() {
        let (next, present) = b.scope(format!("layers.{i}"), |b| layer(b, &ctx, &shared, &x, w, i));
        x = next;
        if has_heads {
            let mean = b.reduce_mean(&x, &[2]);
            cells.push(b.squeeze(&mean, &[2]));
        }
        presents.push(present);
    }
    presents.push(b.scope("token_history", |b| {
        let shape = HeadShape::of(cfg);
        let attention = desc.variant.attention;
        token_history::append(
            b,
            &shared.attn.core,
            attention,
            history,
            &inputs.input_ids,
            shape,
        )
    }));
    let contrastive = w.contrastive.as_ref().map(|head| {
        let embedding = b.scope("contrastive_head", |b| {
            contrastive_embedding(b, &cells, &masks.new, head)
        });
        (embedding, head.proj.shape[0])
    });
    let confidence = w.confidence.as_ref().map(|head| {
        b.scope("confidence_head", |b| {
            confidence_logit(b, &cells, &masks.new, head)
        })
    });
    let logits = b.scope("lm_head", |b| {
        let rows = cfg.vocab;
        lm_head(
            b,
            &ctx,
            &w.final_norm,
            &w.embedding,
            embedding.as_ref(),
            rows,
            &x,
        )
    });
    let shape = HeadShape::of(cfg);
    logits_and_cache_outputs(&mut b, &ctx, shape, &logits, cfg.vocab, &presents);
    let doc = head_outputs(&mut b, desc, contrastive.as_ref(), confidence.as_ref());
    b.finish("needle", doc, desc.to_metadata())
}

/// Declares the outputs of the probe heads the graph computes (the contrastive embedding
/// `[batch, width]`, the confidence logit `[batch]`); returns the model's doc string with
/// them described. Needle 3 files have no contrastive head.
pub fn head_outputs(
    b: &mut GraphBuilder,
    desc: &ExportDescription,
    contrastive: Option<&(Value, usize)>,
    confidence: Option<&Value>,
) -> String {
    if let Some((embedding, width)) = contrastive {
        b.output(
            embedding,
            names::CONTRASTIVE_EMBEDDING,
            data_type::FLOAT,
            &[Dim::Named(BATCH), Dim::Fixed(*width)],
        );
    }
    if let Some(logit) = confidence {
        b.output(
            logit,
            names::CONFIDENCE_LOGIT,
            data_type::FLOAT,
            &[Dim::Named(BATCH)],
        );
    }
    desc.doc_string()
        + &ExportDescription::heads_doc(confidence.is_some(), contrastive.map(|(_, width)| *width))
}

/// The graph inputs, in the contract's order.
struct Inputs {
    input_ids: Value,
    mask: Value,
    position_ids: Value,
    /// Each layer's past cache, then the token history's.
    pasts: Vec<KvPair>,
}

/// Each row's engram window: its last `engram_history` real tokens before this call,
/// read from the token history pair `history`, then this call's tokens.
pub(crate) fn engram_window<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    history: &KvPair,
    masks: &SplitMask,
    input_ids: &Value,
    position_ids: &Value,
) -> EngramWindow {
    let past_ids = b.scope("token_history", |b| {
        let width = ctx.shared.engram.history();
        token_history::last_tokens(
            b,
            ctx.variant.attention,
            history,
            &masks.past,
            &masks.past_len,
            width,
        )
    });
    b.scope("engram_window", |b| {
        engram::window(b, ctx, &past_ids, input_ids, &masks.new, position_ids)
    })
}

/// The attention mask cut at the past: its past columns, its new ones and the past's
/// length. The mask, not the cache, says how many tokens came before: a caller may pass a
/// preallocated cache longer than that which the fused graph's attention updates in place
/// (`past_present_share_buffer`).
pub(crate) struct SplitMask {
    /// `[batch, past_sequence]`.
    pub past: Value,
    /// `[batch, sequence]`.
    pub new: Value,
    /// `[1]`.
    pub past_len: Value,
}

pub(crate) fn split_mask(b: &mut GraphBuilder, mask: &Value, input_ids: &Value) -> SplitMask {
    let total = b.shape_of(mask, 1, 2);
    let seq = b.shape_of(input_ids, 1, 2);
    let past_len = b.sub(&total, &seq);
    let new = b.slice_from(mask, 1, &past_len);
    b.declare(&new, data_type::INT64, &ids_dims(SEQUENCE));
    let from = b.const_i64(&[0]);
    let axis = b.const_i64(&[1]);
    let past = b.op1("Slice", &[mask, &from, &past_len, &axis], vec![]);
    b.declare(&past, data_type::INT64, &ids_dims(PAST_SEQUENCE));
    SplitMask {
        past,
        new,
        past_len,
    }
}

pub(crate) fn ids_dims(len: &'static str) -> [Dim; 2] {
    [Dim::Named(BATCH), Dim::Named(len)]
}

/// `[batch, num_kv_heads, len, width]` of the cached keys (`value` false) or values, the
/// widths the variant's attention core caches (see [`HeadShape::cached_key_dim`]).
fn cache_dims(
    shape: HeadShape,
    attention: AttentionKind,
    len: &'static str,
    value: bool,
) -> [Dim; 4] {
    let width = if value {
        shape.cached_value_dim(attention)
    } else {
        shape.cached_key_dim(attention)
    };
    [
        Dim::Named(BATCH),
        Dim::Fixed(shape.kv_heads),
        Dim::Named(len),
        Dim::Fixed(width),
    ]
}

/// The `past_key_values.{i}.key/.value` inputs of `pairs` cache pairs (the layers', then
/// the token history's).
pub(crate) fn kv_cache_inputs<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    shape: HeadShape,
    pairs: usize,
) -> Vec<KvPair> {
    let float = b.precision().data_type();
    let attention = ctx.variant.attention;
    (0..pairs)
        .map(|i| {
            let n = layer_cache(i);
            KvPair {
                key: b.input(
                    &n.past_key,
                    float,
                    &cache_dims(shape, attention, PAST_SEQUENCE, false),
                ),
                value: b.input(
                    &n.past_value,
                    float,
                    &cache_dims(shape, attention, PAST_SEQUENCE, true),
                ),
            }
        })
        .collect()
}

/// The `logits` output (`width` ids) and each layer's `present.{i}.key/.value`.
pub(crate) fn logits_and_cache_outputs<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    shape: HeadShape,
    logits: &Value,
    width: usize,
    presents: &[KvPair],
) {
    let float = b.precision().data_type();
    let attention = ctx.variant.attention;
    b.output(
        logits,
        names::LOGITS,
        data_type::FLOAT,
        &[Dim::Named(BATCH), Dim::Named(SEQUENCE), Dim::Fixed(width)],
    );
    for (i, p) in presents.iter().enumerate() {
        let n = layer_cache(i);
        let dims = |value| cache_dims(shape, attention, TOTAL_SEQUENCE, value);
        b.output(&p.key, &n.present_key, float, &dims(false));
        b.output(&p.value, &n.present_value, float, &dims(true));
    }
}

fn inputs(b: &mut GraphBuilder, ctx: &BuildContext) -> Inputs {
    let input_ids = b.input(names::INPUT_IDS, data_type::INT64, &ids_dims(SEQUENCE));
    let mask = b.input(
        names::ATTENTION_MASK,
        data_type::INT64,
        &ids_dims(TOTAL_SEQUENCE),
    );
    let position_ids = b.input(names::POSITION_IDS, data_type::INT64, &ids_dims(SEQUENCE));
    let pasts = kv_cache_inputs(b, ctx, HeadShape::of(ctx.cfg), ctx.cfg.num_layers + 1);
    Inputs {
        input_ids,
        mask,
        position_ids,
        pasts,
    }
}

/// `Gather(embedding)·√d` broadcast to the `[batch, sequence, lanes, d_model]` stream.
/// Returns the float table too when it is one (the lm_head is tied to it).
pub(crate) fn embed_tokens<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    embedding: &Tensor,
    input_ids: &Value,
) -> (Option<Value>, Value) {
    // Compact weights keep each use of the table in its own layout: block-quantized, or
    // the codes (rows decoded as gathered, the lm_head a folded kernel).
    let storage = ctx.matmul_weights();
    let dense = match storage {
        MatMulWeights::Float => true,
        MatMulWeights::Cq => embedding.codes.is_none(),
        MatMulWeights::Int8 | MatMulWeights::Int4 => false,
    };
    let emb = dense.then(|| b.weight("embedding", &embedding.shape, &embedding.data));
    let x = match &emb {
        Some(emb) => b.gather(emb, input_ids, 0),
        None => {
            let x = gather_table(b, storage, "embedding", embedding, input_ids);
            // Rows decoded from codes get their shape from a Reshape that shape inference
            // cannot follow; without a name for it, every later tensor gets fresh symbols
            // and session creation took 5 s longer (full-size Needle 3).
            let dims = [
                Dim::Named(BATCH),
                Dim::Named(SEQUENCE),
                Dim::Fixed(ctx.shared.d_model),
            ];
            b.declare(&x, b.precision().data_type(), &dims);
            x
        }
    };
    let scale = b.scalar_float((ctx.shared.d_model as f64).sqrt() as f32);
    let x = b.mul(&x, &scale);
    let x = b.unsqueeze(&x, &[2]);
    let lanes = b.const_i64(&[1, 1, ctx.shared.mhc_lanes as i64, 1]);
    (emb, b.op1("Expand", &[&x, &lanes], vec![]))
}

/// What every layer reads besides the stream: built once at the top of the graph.
struct LayerInputs<'a> {
    attn: AttentionCtx,
    /// Keys and values of each engram site, by site.
    engram_kv: Vec<EngramKv>,
    /// Each layer's past cache.
    pasts: &'a [KvPair],
}

/// Layer `i` of the scan: `hc_pre` → engram (at its sites) → [`block`] → `hc_post`.
fn layer(
    b: &mut GraphBuilder,
    ctx: &BuildContext,
    shared: &LayerInputs<'_>,
    x: &Value,
    w: &Weights,
    i: usize,
) -> (Value, KvPair) {
    let (u, mix) = hc_pre(b, ctx, x, &w.mhc, i);
    let site = ctx.cfg.engram_sites.iter().position(|&s| s == i);
    let bx = match site {
        Some(s) => b.scope(format!("engrams.{s}"), |b| {
            engram::inject(b, ctx, &u, &shared.engram_kv[s])
        }),
        None => u.clone(),
    };
    let (out, present) = block(b, ctx, &shared.attn, &bx, &w.layers[i], &shared.pasts[i]);
    let y = b.sub(&out, &u);
    (hc_post(b, ctx, x, &y, &mix), present)
}

/// Needle `Block`: `x + σ(attn_gate)·post_norm(attn(norm_in x))`, then
/// `+ hadamard_mlp(pre_hada x)`.
fn block(
    b: &mut GraphBuilder,
    ctx: &BuildContext,
    attn: &AttentionCtx,
    x: &Value,
    w: &LayerWeights,
    past: &KvPair,
) -> (Value, KvPair) {
    let h = zc_rms_norm(b, ctx, x, "norm_in", &w.norm_in.data);
    let (h, kv) = b.scope("self_attn", |b| attention(b, ctx, attn, &h, w, past));
    let h = zc_rms_norm(b, ctx, &h, "post_attn_norm", &w.post_norm.data);
    let gate = sigmoid(w.attn_gate.data[0]);
    let gate = b.weight("attn_gate_sigmoid", &[1], &[gate]);
    let h = b.mul(&gate, &h);
    let x = b.add(x, &h);
    let h = zc_rms_norm(b, ctx, &x, "pre_hada_norm", &w.pre_hada.data);
    let h = b.scope("hadamard_mlp", |b| hadamard_mlp(b, &h, w, ctx.cfg.d_model));
    (b.add(&x, &h), kv)
}

/// `1 / (1 + e^-x)` in float32, as XLA's sigmoid of a float32 scalar.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Mean over lanes, `final_norm`, and the output projection tied to the first `rows`
/// rows of the embedding table (the float table `embedding` when there is one); float32
/// logits.
pub(crate) fn lm_head<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    final_norm: &Tensor,
    table: &Tensor,
    embedding: Option<&Value>,
    rows: usize,
    x: &Value,
) -> Value {
    let d_model = ctx.shared.d_model;
    let x = b.reduce_mean(x, &[2]);
    let x = b.squeeze(&x, &[2]);
    let x = zc_rms_norm(b, ctx, &x, "final_norm", &final_norm.data);
    let logits = match embedding {
        Some(embedding) => {
            let head = if rows < table.shape[0] {
                b.slice(embedding, 0, 0, rows as i64)
            } else {
                embedding.clone()
            };
            let et = b.transpose(&head, &[1, 0]);
            b.matmul(&x, &et)
        }
        None => b.scope("embedding", |b| {
            match (ctx.matmul_weights(), &table.codes) {
                (MatMulWeights::Cq, Some(codes)) => {
                    let head = CqKernel::of(&[&codes.first_rows(rows)]).expect("one matrix");
                    let kernel = cq_kernel(b, "kernel", &head);
                    b.matmul(&x, &kernel)
                }
                (storage, _) => {
                    let head = &table.data[..rows * d_model];
                    matmul_nbits(b, storage, &x, head, rows, d_model)
                }
            }
        }),
    };
    match ctx.variant.precision {
        Precision::Fp32 => logits,
        Precision::Fp16 => b.cast(&logits, data_type::FLOAT),
    }
}
