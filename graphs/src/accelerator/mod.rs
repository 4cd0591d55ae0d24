//! The accelerator graphs (`needle-export --target coreml|nnapi|tensorrt`): the model
//! with every shape fixed and every op in a form that onnxruntime's CoreML (MLProgram)
//! and NNAPI execution providers take, so that the accelerator gets the model as one
//! partition. One graph per fixed `sequence`: 1 for a decode step, a chunk for prefill.
//! Batch 1. Both generations, through [`Accelerated`] (`needle2.rs`, `needle3.rs`).
//!
//! The cache has a fixed capacity and belongs to the caller: the graph reads it whole,
//! with `attention_mask` saying which slots hold the row's tokens, and returns this call's
//! keys and values, which the caller writes at the tokens' slots (in place: the cache is
//! never copied through the graph). The capacity is `max_seq_len` slots, slot `p` holding
//! position `p`; or, when every layer attends over a sliding window, a ring of the
//! window's slots (position `p` in slot `p mod window`, `cache_positions` saying which
//! position each slot holds), since no query sees further back.
//!
//! ```text
//! token_window [1, W+S] ─Gather(embedding)·√d ─×1[lanes]─ Slice(last S) ─ layer × L ─ lm_head ─▶ logits [1,S,V]
//!              └─ edge: n-gram hash, GatherElements(tables) ─▶ each engram site's rows [1,W+S,T,sub]
//! position_ids [1, S] ─Gather(cos, sin)─ RoPE;  ─ edge: ReduceMin ≥ W−i ─▶ the window's validity
//! attention_mask [1, C] ─1−m─ ++ causal [S,S] ─ max(window) ─·lowest─▶ bias [1,1,1,S,C+S] over past_key_values ++ this call's keys
//! cache_positions [1, C] (a ring) ─┘ (the slots' positions for the window; else slot p: p)
//! layer i ─▶ new_key_values.{i}.key/.value [1, KV, S, hd] (Needle 3: and .qkv_conv, this call's raw projections)
//! ```
//!
//! The integer work sits at the graph's edge (`edge`), reading graph inputs only; the
//! float blocks are the stock graphs' (`crate::blocks`, `crate::needle2`, `crate::needle3`) in their
//! [`OpForms::MobileAccelerators`] forms, with the [`CoreInputs::FixedCache`] core.

mod edge;
mod needle2;
mod needle3;

use std::borrow::Cow;

use crate::blocks::attention::{lowest_float, CoreInputs, KvPair};
use crate::blocks::context::{BuildContext, Kernels, OpForms, RmsNorm};
use crate::blocks::embedding::{embed_tokens, lm_head};
use crate::blocks::engram::{engram_kv, inject, EngramKv};
use crate::blocks::hyper_connections::{hc_post, hc_pre};
use crate::blocks::weights::{EngramTables, EngramWeights};
use crate::builder::{Dim, GraphBuilder, Opset, Value};
use crate::config::ModelConfig;
use crate::contract::names::{self, layer_cache};
use crate::contract::{keys, AcceleratorTarget, HeadShape, MatMulWeights, Precision};
use crate::description::ExportDescription;
use crate::metadata::Metadata;
use crate::model::ModelWeights;
use crate::onnx::{data_type, ModelProto};
use crate::stream::{block, Architecture, LayerPast};

/// Rows per call of every accelerator graph.
pub const BATCH: usize = 1;

/// Tokens per call of the prefill graph: a prompt goes through it in chunks, the last
/// one padded after the prompt's end.
pub const PREFILL_CHUNK: usize = 64;

/// What an accelerator graph's metadata says of its fixed shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedShape {
    pub target: AcceleratorTarget,
    /// Cache slots (`needle.cache_capacity`): the model's `max_seq_len`, or its sliding
    /// window when the cache is a ring.
    pub capacity: usize,
    /// Whether the cache is a ring (`needle.cache_ring`): position `p` in slot
    /// `p mod capacity`, the graph reading `cache_positions`. Graphs written before rings
    /// existed lack the key: theirs is not.
    pub ring: bool,
    /// Tokens per call (`needle.fixed_sequence`): 1, or [`PREFILL_CHUNK`].
    pub sequence: usize,
}

impl FixedShape {
    /// Reads it from a graph's metadata (`get` looks a key up); `None` for a stock graph
    /// (no `needle.target`). The error names the missing or malformed key.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        if get(keys::TARGET).is_none() {
            return Ok(None);
        }
        let read = Metadata(&get);
        Ok(Some(FixedShape {
            target: read.spelled(keys::TARGET)?,
            capacity: read.parsed(keys::CACHE_CAPACITY)?,
            ring: match get(keys::CACHE_RING) {
                Some(_) => read.parsed(keys::CACHE_RING)?,
                None => false,
            },
            sequence: read.parsed(keys::FIXED_SEQUENCE)?,
        }))
    }
}

/// What an accelerator graph for `target` cannot be yet, or `Ok`: dense float weights,
/// float32, or float16 where the target's execution provider takes float16 tensors
/// (CoreML's MLProgram, TensorRT). onnxruntime's NNAPI EP takes float32 tensors only and
/// runs them in fp16 when asked (`NNAPI_FLAG_USE_FP16`), so fp16 there is a session
/// option on the float32 graph.
pub fn check(desc: &ExportDescription, target: AcceleratorTarget) -> Result<(), String> {
    if desc.variant.precision == Precision::Fp16 && target == AcceleratorTarget::Nnapi {
        return Err(
            "--target nnapi graphs are float32 (onnxruntime's NNAPI EP takes no \
                    float16 tensors): export without --precision fp16 and run it in fp16 \
                    with the NNAPI EP's NNAPI_FLAG_USE_FP16"
                .into(),
        );
    }
    if desc.variant.matmul_weights != MatMulWeights::Float {
        return Err("accelerator graphs (--target) take --weights float only".into());
    }
    Ok(())
}

/// The accelerator graph for `target` that takes `sequence` tokens a call.
///
/// # Panics
/// When [`check`] refuses `desc`, or `weights` are of another generation.
pub fn build(
    desc: &ExportDescription,
    weights: &ModelWeights,
    target: AcceleratorTarget,
    sequence: usize,
) -> ModelProto {
    check(desc, target).expect("the caller checks the description first");
    match (&desc.config, weights) {
        (ModelConfig::Needle2(cfg), ModelWeights::Needle2(w)) => {
            build_stream(desc, cfg, w, target, sequence)
        }
        (ModelConfig::Needle3(cfg), ModelWeights::Needle3(w)) => {
            build_stream(desc, cfg, w, target, sequence)
        }
        _ => panic!("the weights are of another generation than the description"),
    }
}

/// What a generation puts into the accelerator stream besides its stock [`Architecture`].
pub(crate) trait Accelerated: Architecture {
    /// The sliding window of each attention core the layers pick from (`None`: every
    /// earlier key).
    fn core_windows(&self) -> Vec<Option<usize>>;
    /// Every layer's attention context: RoPE for `position_ids` and `cores`, one
    /// [`CoreInputs::FixedCache`] per [`Self::core_windows`] entry.
    fn fixed_attention(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Self>,
        position_ids: &Value,
        cores: Vec<CoreInputs>,
    ) -> Self::Attention;
}

/// The graph inputs.
struct Inputs {
    /// `int32 [1, W + S]`.
    token_window: Value,
    /// `int32 [1, S]`.
    position_ids: Value,
    /// `float [1, C]`, 1 for the slots that hold the row's tokens.
    mask: Value,
    /// `int32 [1, C]`, a ring's slots' positions; `None`: slot `p` holds position `p`.
    cache_positions: Option<Value>,
    /// Each layer's cache, `[1, KV, C, hd]`.
    pasts: Vec<KvPair>,
    /// Each layer's state besides its cache, `[1, slots, width]` (none when the
    /// generation has none): the last `slots` rows of what the layer returned before.
    states: Vec<Value>,
}

fn build_stream<A: Accelerated>(
    desc: &ExportDescription,
    cfg: &A,
    w: &A::Weights,
    target: AcceleratorTarget,
    sequence: usize,
) -> ModelProto {
    let common = cfg.common();
    let ctx = BuildContext {
        cfg,
        common,
        variant: desc.variant,
        kernels: Kernels {
            rms_normalization: RmsNorm::Expanded,
            rotary_embedding: None,
            needle_ops: false,
            op_forms: OpForms::MobileAccelerators,
        },
    };
    let stream = A::stream_weights(w);
    let e = &common.engram;
    let history = e.history();
    let window = history + sequence;
    let ring = ring_window(cfg);
    let capacity = ring.unwrap_or(common.max_seq_len);
    let mut b = GraphBuilder::new(Opset::V21, desc.variant.precision);
    let float = b.precision().data_type();
    let inputs = declare_inputs(&mut b, cfg, window, sequence, capacity, ring.is_some());

    let valid = edge::window_validity(&mut b, &inputs.position_ids, history, window);
    let valid = b.cast(&valid, float);
    let attention = b.scope("attn_ctx", |b| {
        let cores = cfg
            .core_windows()
            .into_iter()
            .map(|keys| CoreInputs::FixedCache {
                bias: attention_bias(b, &inputs, keys, sequence, capacity),
            })
            .collect();
        A::fixed_attention(b, &ctx, &inputs.position_ids, cores)
    });
    let engram_kv = engram_sites(
        &mut b,
        &ctx,
        stream.engrams,
        &inputs.token_window,
        &valid,
        window,
    );
    let constants = A::mlp_constants(&mut b, &ctx, w);

    let (embedding, x) = b.scope("embed_tokens", |b| {
        embed_tokens(b, &ctx, stream.embedding, &inputs.token_window)
    });
    let mut x = b.slice(&x, 1, history as i64, window as i64);
    let layers = A::layers(w);
    let mut new_kvs: Vec<(KvPair, Option<Value>)> = Vec::with_capacity(layers.len());
    for (i, layer_weights) in layers.iter().enumerate() {
        let (next, new_kv) = b.scope(format!("layers.{i}"), |b| {
            let (u, mix) = hc_pre(b, &ctx, &x, stream.mhc, i, None);
            let site = e.sites.iter().position(|&s| s == i);
            let bx = match site {
                Some(s) => b.scope(format!("engrams.{s}"), |b| {
                    inject(b, &ctx, &u, &engram_kv[s])
                }),
                None => u.clone(),
            };
            let past = LayerPast {
                kv: &inputs.pasts[i],
                state: inputs.states.get(i),
            };
            let (out, new_kv, new_state) =
                block(b, &ctx, &attention, &constants, i, &bx, layer_weights, past);
            (
                hc_post(b, &ctx, &x, &out, &u, &mix, None).0,
                (new_kv, new_state),
            )
        });
        x = next;
        new_kvs.push(new_kv);
    }
    let logits = b.scope("lm_head", |b| {
        lm_head(
            b,
            &ctx,
            stream.final_norm,
            stream.embedding,
            &embedding,
            cfg.output_rows(),
            &x,
        )
    });
    declare_outputs(&mut b, cfg, &logits, &new_kvs, sequence);
    let mut model = b.finish(
        "needle",
        doc_string(desc, sequence, capacity, ring.is_some()),
        metadata(desc, target, sequence, capacity, ring.is_some()),
    );
    // The shared blocks name some shapes with the stock graphs' symbols; here every shape
    // is fixed and shape inference finds them all, which the checker needs to see.
    if let Some(graph) = model.graph.as_mut() {
        graph.value_info.clear();
    }
    model
}

/// The window every layer attends over, when every layer's binds: the ring's slots. No
/// query sees a key that many positions back, so the slots of the `window` latest
/// positions before a call hold all it can see.
fn ring_window<A: Accelerated>(cfg: &A) -> Option<usize> {
    let windows = cfg.core_windows();
    match windows[..] {
        [Some(first), ..] if windows.iter().all(|&w| w == Some(first)) => Some(first),
        _ => None,
    }
}

/// Keys and values of every engram site for this call's tokens, from the rows the
/// integer edge fetched.
fn engram_sites<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    sites: &[EngramWeights],
    token_window: &Value,
    valid: &Value,
    window: usize,
) -> Vec<EngramKv> {
    if sites.is_empty() {
        return Vec::new();
    }
    let e = &ctx.common.engram;
    let indices = edge::table_indices(b, e, ctx.common.vocab, token_window, window);
    sites
        .iter()
        .enumerate()
        .map(|(s, site)| {
            b.scope(format!("engrams.{s}"), |b| {
                // The rows the graph gathers are float: the codes' decoding gathers by the
                // codes' values, which CoreML would leave to the CPU mid-stream.
                let tables = match &site.tables {
                    EngramTables::Dense(t) => Cow::Borrowed(t.data.as_slice()),
                    EngramTables::Codes(codes) => Cow::Owned(codes.decoded()),
                };
                let rows = edge::fetch_rows(b, e, &tables, &indices);
                let rows = b.transpose(&rows, &[1, 2, 0, 3]);
                engram_kv(b, ctx, valid, &rows, site)
            })
        })
        .collect()
}

/// `[1, 1, 1, S, C + S]`: 0 where a query sees a key, the lowest float where not. The
/// cached slots (a ring's too) are all before this call's tokens, so a query sees every
/// slot the mask marks; among this call's tokens it sees itself and those before it; with a sliding
/// window of `w` keys, only keys fewer than `w` positions back. Written as a 0/1
/// "hidden" indicator (float ops only: NNAPI has no comparisons), scaled once.
fn attention_bias(
    b: &mut GraphBuilder,
    inputs: &Inputs,
    window: Option<usize>,
    sequence: usize,
    capacity: usize,
) -> Value {
    let one = b.scalar_float(1.0);
    let empty = b.sub(&one, &inputs.mask);
    let empty = b.reshape(&empty, &[1, 1, 1, 1, capacity as i64]);
    let rows = b.const_float(
        &[1, 1, 1, sequence, capacity],
        &vec![0.0; sequence * capacity],
    );
    let past = b.add(&empty, &rows);
    let later: Vec<f32> = (0..sequence * sequence)
        .map(|k| {
            if k % sequence <= k / sequence {
                0.0
            } else {
                1.0
            }
        })
        .collect();
    let later = b.const_float(&[1, 1, 1, sequence, sequence], &later);
    let mut hidden = b.concat(&[&past, &later], 4);
    if let Some(keys) = window {
        let out_of_window = b.scope("sliding_window", |b| {
            out_of_window(b, inputs, keys, sequence, capacity)
        });
        hidden = b.op1("Max", &[&hidden, &out_of_window], vec![]);
    }
    let lowest = b.scalar_float(lowest_float(b.precision()));
    b.mul(&hidden, &lowest)
}

/// `[1, 1, 1, S, C + S]`: 1 where the key is `keys` or more positions before the query.
/// A slot holds the position `cache_positions` gives (a ring), else its own index; this
/// call's keys are at its queries' positions. The distance `d` is a whole number, so
/// `clip(d − (keys − 1), 0, 1)` is 0 within the window and 1 beyond it.
fn out_of_window(
    b: &mut GraphBuilder,
    inputs: &Inputs,
    keys: usize,
    sequence: usize,
    capacity: usize,
) -> Value {
    let float = b.precision().data_type();
    let queries = b.cast(&inputs.position_ids, float);
    let slots = match &inputs.cache_positions {
        Some(positions) => b.cast(positions, float),
        None => {
            let slots: Vec<f32> = (0..capacity).map(|p| p as f32).collect();
            b.const_float(&[1, capacity], &slots)
        }
    };
    let key_positions = b.concat(&[&slots, &queries], 1);
    let key_positions = b.reshape(&key_positions, &[1, 1, 1, 1, (capacity + sequence) as i64]);
    let queries = b.reshape(&queries, &[1, 1, 1, sequence as i64, 1]);
    let distance = b.sub(&queries, &key_positions);
    let reach = b.scalar_float(keys as f32 - 1.0);
    let beyond = b.sub(&distance, &reach);
    let (zero, one) = (b.scalar_float(0.0), b.scalar_float(1.0));
    b.op1("Clip", &[&beyond, &zero, &one], vec![])
}

fn fixed(dims: &[usize]) -> Vec<Dim> {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// `[1, KV, len, width]` of the cached keys (`value` false) or values.
fn cache_dims(shape: HeadShape, len: usize, value: bool) -> Vec<Dim> {
    let width = if value { shape.v_dim } else { shape.qk_dim };
    fixed(&[BATCH, shape.kv_heads, len, width])
}

fn declare_inputs<A: Accelerated>(
    b: &mut GraphBuilder,
    cfg: &A,
    window: usize,
    sequence: usize,
    capacity: usize,
    ring: bool,
) -> Inputs {
    let float = b.precision().data_type();
    let token_window = b.input(
        names::TOKEN_WINDOW,
        data_type::INT32,
        &fixed(&[BATCH, window]),
    );
    let position_ids = b.input(
        names::POSITION_IDS,
        data_type::INT32,
        &fixed(&[BATCH, sequence]),
    );
    let mask = b.input(names::ATTENTION_MASK, float, &fixed(&[BATCH, capacity]));
    let cache_positions = ring.then(|| {
        b.input(
            names::CACHE_POSITIONS,
            data_type::INT32,
            &fixed(&[BATCH, capacity]),
        )
    });
    let shape = cfg.head_shape();
    let pasts = (0..cfg.common().num_layers)
        .map(|i| {
            let n = layer_cache(i);
            KvPair {
                key: b.input(&n.past_key, float, &cache_dims(shape, capacity, false)),
                value: b.input(&n.past_value, float, &cache_dims(shape, capacity, true)),
            }
        })
        .collect();
    let states = match cfg.layer_state() {
        Some((slots, width)) => (0..cfg.common().num_layers)
            .map(|i| {
                let (past, _) = names::qkv_conv_state(i);
                b.input(&past, float, &fixed(&[BATCH, slots, width]))
            })
            .collect(),
        None => Vec::new(),
    };
    Inputs {
        token_window,
        position_ids,
        mask,
        cache_positions,
        pasts,
        states,
    }
}

fn declare_outputs<A: Accelerated>(
    b: &mut GraphBuilder,
    cfg: &A,
    logits: &Value,
    new_kvs: &[(KvPair, Option<Value>)],
    sequence: usize,
) {
    let float = b.precision().data_type();
    let (vocab, shape) = (cfg.output_rows(), cfg.head_shape());
    b.output(
        logits,
        names::LOGITS,
        data_type::FLOAT,
        &fixed(&[BATCH, sequence, vocab]),
    );
    for (i, (kv, state)) in new_kvs.iter().enumerate() {
        let (key, value) = names::new_key_values(i);
        b.output(&kv.key, &key, float, &cache_dims(shape, sequence, false));
        b.output(&kv.value, &value, float, &cache_dims(shape, sequence, true));
        if let (Some(state), Some((_, width))) = (state, cfg.layer_state()) {
            let name = names::new_state(i);
            b.output(state, &name, float, &fixed(&[BATCH, sequence, width]));
        }
    }
}

/// The stock description's metadata without what only the stock interface has (a token
/// history pair, shared past/present buffers), and the accelerator's own keys.
fn metadata(
    desc: &ExportDescription,
    target: AcceleratorTarget,
    sequence: usize,
    capacity: usize,
    ring: bool,
) -> Vec<(String, String)> {
    let stock_only = [keys::TOKEN_HISTORY, keys::PAST_PRESENT_SHARE_BUFFER];
    let mut meta: Vec<(String, String)> = desc
        .to_metadata()
        .into_iter()
        .filter(|(k, _)| !stock_only.contains(&k.as_str()))
        .collect();
    meta.push((keys::TARGET.into(), target.to_string()));
    meta.push((keys::CACHE_CAPACITY.into(), capacity.to_string()));
    meta.push((keys::CACHE_RING.into(), ring.to_string()));
    meta.push((keys::FIXED_SEQUENCE.into(), sequence.to_string()));
    meta
}

fn doc_string(desc: &ExportDescription, sequence: usize, capacity: usize, ring: bool) -> String {
    let history = desc.config.engram_history();
    let (key, _) = names::new_key_values(0);
    let mut doc = format!(
        "Needle {} accelerator graph (fixed shapes, batch {BATCH}, {sequence} token(s) a call, \
         a cache of {capacity} slots). Inputs: {tw} int32 [1, {w}], the row's {history} tokens \
         before this call (0 where it has none) then this call's; {pos} int32 [1, {sequence}], \
         their positions; {mask} [1, {capacity}], 1 for the cache slots that hold the row's \
         tokens; past_key_values.{{i}}.key/.value [1, kv, {capacity}, ·], the cache \
         ({layout}). Outputs: {logits} [1, {sequence}, vocab] float32; \
         {kv}/.value [1, kv, {sequence}, ·]: this call's keys and values, to be written into \
         the cache at their positions' slots (a final chunk's padding: not at all).",
        desc.generation(),
        tw = names::TOKEN_WINDOW,
        w = history + sequence,
        pos = names::POSITION_IDS,
        mask = names::ATTENTION_MASK,
        logits = names::LOGITS,
        kv = key.replace(".0.", ".{i}."),
        layout = if ring {
            format!(
                "a ring: position p in slot p mod {capacity}; {} int32 [1, {capacity}], \
                 the position each slot holds",
                names::CACHE_POSITIONS
            )
        } else {
            "slot p: position p".to_string()
        },
    );
    if let Some((slots, width)) = desc.config.qkv_conv_state() {
        let (past, _) = names::qkv_conv_state(0);
        doc.push_str(&format!(
            " Per layer also {} [1, {slots}, {width}], the row's last {slots} raw q, k and v \
             projections before this call (zeros before its start), and out {} [1, \
             {sequence}, {width}], this call's, whose last real {slots} are the next state.",
            past.replace(".0.", ".{i}."),
            names::new_state(0).replace(".0.", ".{i}."),
        ));
    }
    doc
}
