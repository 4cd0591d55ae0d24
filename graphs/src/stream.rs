//! `SimpleAttentionNetwork.__call__` with a KV cache, from `input_ids` to `logits`, written
//! once for both generations; each generation fills in its part through [`Architecture`]
//! (its attention, MLP, probe heads, state besides the KV cache):
//!
//! ```text
//! input_ids ─Gather(embedding)·√d─ Expand(n lanes) ─┬─ layer 0 … layer L−1 ─ mean(lanes) ─ final_norm ─ ·E[:rows]ᵀ ─▶ logits
//!                                                    │   hc_pre → [engram] → block → hc_post
//!                                                    │   block: x + σ(gate)·post_norm(attention(norm_in x)), + mlp(pre_hada x)
//!             [probe heads] x0 and each layer's lane mean ──────────────▶ contrastive_embedding, confidence_logit
//! token history ++ input_ids ─ engram hash ──────────┘ (engram sites only)
//! input_ids ─ written into the token history (one more cache pair) ─▶ present.{L}
//! position_ids, attention_mask ─ RoPE, attention masks, engram validity (per row)
//! ```
//!
//! The names it reads and writes are the contract's.

use crate::blocks::attention::{CoreInputs, KvPair};
use crate::blocks::context::BuildContext;
use crate::blocks::embedding::{embed_tokens, lm_head};
use crate::blocks::engram::{self, EngramWindow};
use crate::blocks::hyper_connections::{hc_post, hc_pre};
use crate::blocks::norms::{zc_gain, zc_rms_norm, ZcNormed};
use crate::blocks::token_history;
use crate::blocks::weights::{EngramWeights, MhcWeights, Tensor};
use crate::builder::{Dim, GraphBuilder, Value};
use crate::contract::dims::{BATCH, LOGITS_SEQUENCE, PAST_SEQUENCE, SEQUENCE, TOTAL_SEQUENCE};
use crate::contract::names::{self, layer_cache};
use crate::contract::needle_ops;
use crate::contract::{AttentionKind, HeadShape, MatMulWeights};
use crate::description::ExportDescription;
use crate::geometry::Geometry;
use crate::onnx::{data_type, ModelProto};

/// The weights of the stream around the blocks.
pub(crate) struct StreamWeights<'a> {
    /// `[vocab, d_model]`, tied with the output head.
    pub embedding: &'a Tensor,
    pub mhc: &'a MhcWeights,
    pub engrams: &'a [EngramWeights],
    pub final_norm: &'a Tensor,
}

/// A block's norms and residual gate, the same in both generations.
pub(crate) struct BlockNorms<'a> {
    pub norm_in: &'a Tensor,
    pub post_norm: &'a Tensor,
    pub attn_gate: &'a Tensor,
    pub pre_hada: &'a Tensor,
}

/// The probe heads' outputs a graph computes.
pub(crate) struct Heads {
    /// The contrastive embedding and its width.
    pub contrastive: Option<(Value, usize)>,
    pub confidence: Option<Value>,
    /// The confidence head's running pools after the call, where the graph carries them.
    pub confidence_pools: Option<Value>,
}

/// What one generation puts into the stream.
pub(crate) trait Architecture: Geometry + Sized {
    type Weights;
    type LayerWeights;
    /// What every layer's attention reads, built once at the top (RoPE, the cores' inputs).
    type Attention;
    /// What every layer's MLP reads, built once before the layers.
    type MlpConstants;

    fn stream_weights(w: &Self::Weights) -> StreamWeights<'_>;
    fn layers(w: &Self::Weights) -> &[Self::LayerWeights];
    fn block_norms(w: &Self::LayerWeights) -> BlockNorms<'_>;

    /// `(slots, width)` of each layer's state besides its KV cache (`None`: no such state).
    fn layer_state(&self) -> Option<(usize, usize)>;
    /// Rows of the embedding the output head is tied to: the `logits` width.
    fn output_rows(&self) -> usize;

    fn attention_inputs(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Self>,
        inputs: &Inputs,
        masks: &SplitMask,
    ) -> Self::Attention;
    /// The attention core the token history is written through.
    fn history_core(attention: &Self::Attention) -> &CoreInputs;
    fn mlp_constants(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Self>,
        w: &Self::Weights,
    ) -> Self::MlpConstants;

    /// Attention of layer `layer`: its output, present cache and next state.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Self>,
        attention: &Self::Attention,
        layer: usize,
        x: &ZcNormed,
        w: &Self::LayerWeights,
        past: &KvPair,
        state: Option<&Value>,
    ) -> (Value, KvPair, Option<Value>);
    /// The layer's MLP of its normed input `x`, in stock nodes.
    fn mlp(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Self>,
        constants: &Self::MlpConstants,
        x: &Value,
        w: &Self::LayerWeights,
    ) -> Value;
    /// The layer's MLP half `x + mlp(norm(x))` as one Needle node (graphs with the Needle
    /// ops), `gain` the pre-MLP norm's.
    fn mlp_op(
        b: &mut GraphBuilder,
        constants: &Self::MlpConstants,
        x: &Value,
        gain: &Value,
        w: &Self::LayerWeights,
    ) -> Value;

    /// Whether the probe heads read the hidden cells.
    fn has_heads(w: &Self::Weights) -> bool;
    /// The probe heads over `cells` (the scaled embedding, then each layer's lane mean);
    /// `keep`: `[batch, sequence]`, 1 for the row's real tokens; `past_pools`: the
    /// confidence head's running pools before the call, where the graph carries them.
    fn heads(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Self>,
        w: &Self::Weights,
        cells: &[Value],
        keep: &Value,
        past_pools: Option<&Value>,
    ) -> Heads;
}

/// Builds the graph `desc` describes, with `desc`'s metadata in `metadata_props`.
/// The fused variant is onnxruntime's fast path (single-kernel norms and RoPE,
/// `GroupQueryAttention`); the reference variant stays on opset-21 primitives so that any
/// runtime and execution provider takes all of it (see [`BuildContext`]).
pub(crate) fn build<A: Architecture>(
    desc: &ExportDescription,
    cfg: &A,
    w: &A::Weights,
) -> ModelProto {
    let ctx = BuildContext::new(cfg, desc.variant);
    let stream = A::stream_weights(w);
    let layers = A::layers(w);
    let num_layers = ctx.common.num_layers;
    let mut b = GraphBuilder::new(ctx.kernels.opset(), desc.variant.precision);
    let inputs = inputs(&mut b, &ctx, desc.confidence_pools);
    let masks = b.scope("new_mask", |b| {
        split_mask(b, &inputs.mask, &inputs.input_ids)
    });
    let attention = b.scope("attn_ctx", |b| {
        A::attention_inputs(b, &ctx, &inputs, &masks)
    });
    let history = &inputs.pasts[num_layers];
    let window = engram_window(&mut b, &ctx, history, &masks, &inputs);
    let engram_kv = engram::site_kvs(&mut b, &ctx, stream.engrams, &window);
    let constants = A::mlp_constants(&mut b, &ctx, w);

    let (embedding, mut x) = b.scope("embed_tokens", |b| {
        embed_tokens(b, &ctx, stream.embedding, &inputs.input_ids)
    });
    // The probe heads' cells (upstream `hidden_cells`): the scaled embedding (one lane of
    // the stream, exactly), then each layer's lane mean. Packed graphs take them after the
    // layers, from the streams kept here (`packed_cells` says why).
    let has_heads = A::has_heads(w);
    let mut cells = Vec::new();
    let mut streams = Vec::new();
    if has_heads {
        match ctx.kernels.needle_ops {
            true => streams.push(x.clone()),
            false => cells.push(embedding_cell(&mut b, &x)),
        }
    }
    let mut presents = Vec::with_capacity(layers.len());
    let mut next_states = Vec::with_capacity(layers.len());
    // Layer `i`'s mixing logits where layer `i − 1`'s `hc_post` projected them.
    let mut projected = None;
    for (i, layer_weights) in layers.iter().enumerate() {
        let (next, present, state) = b.scope(format!("layers.{i}"), |b| {
            // Layer `i`: `hc_pre` → engram (at its sites) → block → `hc_post`.
            let (u, mix) = hc_pre(b, &ctx, &x, stream.mhc, i, projected.take());
            let site = ctx.common.engram.sites.iter().position(|&s| s == i);
            let bx = match site {
                Some(s) => b.scope(format!("engrams.{s}"), |b| {
                    engram::inject(b, &ctx, &u, &engram_kv[s])
                }),
                None => u.clone(),
            };
            let past = LayerPast {
                kv: &inputs.pasts[i],
                state: inputs.states.get(i),
            };
            let (out, present, state) =
                block(b, &ctx, &attention, &constants, i, &bx, layer_weights, past);
            let next_layer = (i + 1 < layers.len()).then_some((stream.mhc, i + 1));
            (
                hc_post(b, &ctx, &x, &out, &u, &mix, next_layer),
                present,
                state,
            )
        });
        (x, projected) = next;
        if has_heads {
            match ctx.kernels.needle_ops {
                true => streams.push(x.clone()),
                false => {
                    let mean = b.reduce_mean(&x, &[2]);
                    cells.push(b.squeeze(&mean, &[2]));
                }
            }
        }
        presents.push(present);
        next_states.extend(state);
    }
    presents.push(b.scope("token_history", |b| {
        token_history::append(
            b,
            A::history_core(&attention),
            desc.variant.attention,
            history,
            &inputs.input_ids,
            cfg.head_shape(),
        )
    }));
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
    outputs(&mut b, &ctx, &logits, &presents, &next_states);
    // The heads come last, after the other outputs' nodes, so that theirs are the graph's
    // latest: onnxruntime's default execution order walks back from the output nodes,
    // latest first, and from the heads it reaches each layer's cell right after that layer
    // (`stack_cells`). Walking back from the logits or a present first runs every layer
    // before any cell is taken.
    if !streams.is_empty() {
        cells = packed_cells(&mut b, &streams);
    }
    let past_pools = inputs.confidence_pools.as_ref();
    let heads = A::heads(&mut b, &ctx, w, &cells, &masks.new, past_pools);
    let doc = head_outputs(&mut b, desc, &heads);
    b.finish("needle", doc, desc.to_metadata())
}

/// The embedding's cell `[batch, sequence, d]`: lane 0 of its stream `[batch, sequence,
/// lanes, d]`, whose lanes are copies.
fn embedding_cell(b: &mut GraphBuilder, x: &Value) -> Value {
    let x0 = b.slice(x, 2, 0, 1);
    b.squeeze(&x0, &[2])
}

/// The packed graphs' cells from the streams (the embedding's first): each layer's lane
/// mean in one node. The nodes are made last layer first, so that onnxruntime's default
/// execution order (a depth-first walk back from the outputs, a node's inputs taken
/// latest node first) runs each after its layer and frees the layer's stream then; a
/// head that reads the cells in one node (`needle.ProbePool`) would otherwise take them
/// after the last layer, every stream alive until then (~200 MB over a 784-token forward
/// of the full-size Needle 3).
fn packed_cells(b: &mut GraphBuilder, streams: &[Value]) -> Vec<Value> {
    let (embedding, layers) = streams.split_first().expect("the embedding's stream");
    let mut cells: Vec<Value> = layers
        .iter()
        .rev()
        .map(|x| b.reduce_mean_dropping(x, &[2]))
        .collect();
    cells.push(embedding_cell(b, embedding));
    cells.reverse();
    cells
}

/// One layer's state in: its KV cache and, when the generation has one, its other state.
pub(crate) struct LayerPast<'a> {
    pub kv: &'a KvPair,
    pub state: Option<&'a Value>,
}

/// `Block`: `x + σ(attn_gate)·post_norm(attention(norm_in x))`, then
/// `+ mlp(pre_hada_norm x)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block<A: Architecture>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<A>,
    attention: &A::Attention,
    constants: &A::MlpConstants,
    layer: usize,
    x: &Value,
    w: &A::LayerWeights,
    past: LayerPast<'_>,
) -> (Value, KvPair, Option<Value>) {
    let norms = A::block_norms(w);
    // Packed graphs leave norm_in to the attention's projection node.
    let h = match ctx.kernels.needle_ops {
        true => ZcNormed::Deferred {
            x,
            name: "norm_in",
            scale: &norms.norm_in.data,
        },
        false => ZcNormed::Applied(zc_rms_norm(b, ctx, x, "norm_in", &norms.norm_in.data)),
    };
    let (h, kv, state) = b.scope("self_attn", |b| {
        A::attention(b, ctx, attention, layer, &h, w, past.kv, past.state)
    });
    let gate = sigmoid(norms.attn_gate.data[0]);
    let x = match ctx.kernels.needle_ops {
        true => b.scope("post_attn_norm", |b| {
            let gain = zc_gain(b, "gain", &norms.post_norm.data);
            let gate = b.weight("attn_gate_sigmoid", &[1], &[gate]);
            let inputs = [x, &h, &gain, &gate];
            b.op_in(
                needle_ops::DOMAIN,
                needle_ops::RESIDUAL_NORM,
                &inputs,
                vec![],
                1,
            )
            .remove(0)
        }),
        false => {
            let h = zc_rms_norm(b, ctx, &h, "post_attn_norm", &norms.post_norm.data);
            let gate = b.weight("attn_gate_sigmoid", &[1], &[gate]);
            let h = b.mul(&gate, &h);
            b.add(x, &h)
        }
    };
    if ctx.kernels.needle_ops {
        let x = b.scope("hadamard_mlp", |b| {
            let gain = zc_gain(b, "pre_norm_gain", &norms.pre_hada.data);
            A::mlp_op(b, constants, &x, &gain, w)
        });
        return (x, kv, state);
    }
    let h = zc_rms_norm(b, ctx, &x, "pre_hada_norm", &norms.pre_hada.data);
    let h = b.scope("hadamard_mlp", |b| A::mlp(b, ctx, constants, &h, w));
    (b.add(&x, &h), kv, state)
}

/// `1 / (1 + e^-x)` in float32, as XLA's sigmoid of a float32 scalar.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Declares the outputs of the probe heads the graph computes (the contrastive embedding
/// `[batch, width]`, the confidence logit `[batch]`); returns the model's doc string with
/// them described.
fn head_outputs(b: &mut GraphBuilder, desc: &ExportDescription, heads: &Heads) -> String {
    if let Some((embedding, width)) = &heads.contrastive {
        b.output(
            embedding,
            names::CONTRASTIVE_EMBEDDING,
            data_type::FLOAT,
            &[Dim::Named(BATCH), Dim::Fixed(*width)],
        );
    }
    if let Some(logit) = &heads.confidence {
        b.output(
            logit,
            names::CONFIDENCE_LOGIT,
            data_type::FLOAT,
            &[Dim::Named(BATCH)],
        );
    }
    if let (Some(pools), Some(count)) = (&heads.confidence_pools, desc.confidence_pools) {
        let dims = pools_dims(desc.config.common().d_model, count);
        b.output(
            pools,
            names::PRESENT_CONFIDENCE_POOLS,
            data_type::FLOAT,
            &dims,
        );
    }
    let contrastive_dim = heads.contrastive.as_ref().map(|(_, width)| *width);
    desc.doc_string() + &desc.heads_doc(heads.confidence.is_some(), contrastive_dim)
}

/// The graph inputs, in the contract's order.
pub(crate) struct Inputs {
    pub input_ids: Value,
    pub mask: Value,
    pub position_ids: Value,
    /// Each layer's past cache, then the token history's.
    pub pasts: Vec<KvPair>,
    /// Each layer's state besides its cache (empty when the generation has none).
    pub states: Vec<Value>,
    /// The confidence head's running pools, where the graph carries them.
    pub confidence_pools: Option<Value>,
}

/// Each row's engram window: its last `engram_history` real tokens before this call,
/// read from the token history pair `history`, then this call's tokens.
fn engram_window<A>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<A>,
    history: &KvPair,
    masks: &SplitMask,
    inputs: &Inputs,
) -> EngramWindow {
    let past_ids = b.scope("token_history", |b| {
        let width = ctx.common.engram.history();
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
        engram::window(
            b,
            ctx,
            &past_ids,
            &inputs.input_ids,
            &masks.new,
            &inputs.position_ids,
        )
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

fn split_mask(b: &mut GraphBuilder, mask: &Value, input_ids: &Value) -> SplitMask {
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

fn ids_dims(len: &'static str) -> [Dim; 2] {
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

/// `[batch, slots, width]` of each layer's state besides its cache.
fn state_dims<A: Architecture>(cfg: &A) -> Option<[Dim; 3]> {
    let (slots, width) = cfg.layer_state()?;
    Some([Dim::Named(BATCH), Dim::Fixed(slots), Dim::Fixed(width)])
}

/// `[batch, pools, d + 2]` of the confidence head's running pools.
fn pools_dims(d: usize, pools: usize) -> [Dim; 3] {
    [Dim::Named(BATCH), Dim::Fixed(pools), Dim::Fixed(d + 2)]
}

/// The graph inputs; `confidence_pools`: the running pools' count where the graph carries
/// them (after every other state).
fn inputs<A: Architecture>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<A>,
    confidence_pools: Option<usize>,
) -> Inputs {
    let input_ids = b.input(names::INPUT_IDS, data_type::INT64, &ids_dims(SEQUENCE));
    let mask = b.input(
        names::ATTENTION_MASK,
        data_type::INT64,
        &ids_dims(TOTAL_SEQUENCE),
    );
    let position_ids = b.input(names::POSITION_IDS, data_type::INT64, &ids_dims(SEQUENCE));
    let float = b.precision().data_type();
    let shape = ctx.cfg.head_shape();
    let attention = ctx.variant.attention;
    // The layers' cache pairs, then the token history's.
    let pasts = (0..ctx.common.num_layers + 1)
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
        .collect();
    let states = match state_dims(ctx.cfg) {
        Some(dims) => (0..ctx.common.num_layers)
            .map(|i| b.input(&names::qkv_conv_state(i).0, data_type::FLOAT, &dims))
            .collect(),
        None => Vec::new(),
    };
    let confidence_pools = confidence_pools.map(|pools| {
        let dims = pools_dims(ctx.common.d_model, pools);
        b.input(names::PAST_CONFIDENCE_POOLS, data_type::FLOAT, &dims)
    });
    Inputs {
        input_ids,
        mask,
        position_ids,
        pasts,
        states,
        confidence_pools,
    }
}

/// The graph outputs, in the contract's order: `logits`, each pair's
/// `present.{i}.key/.value`, then each layer's next state.
fn outputs<A: Architecture>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<A>,
    logits: &Value,
    presents: &[KvPair],
    next_states: &[Value],
) {
    let float = b.precision().data_type();
    let shape = ctx.cfg.head_shape();
    let attention = ctx.variant.attention;
    let positions = match ctx.matmul_weights() {
        MatMulWeights::Packed => LOGITS_SEQUENCE,
        _ => SEQUENCE,
    };
    b.output(
        logits,
        names::LOGITS,
        data_type::FLOAT,
        &[
            Dim::Named(BATCH),
            Dim::Named(positions),
            Dim::Fixed(ctx.cfg.output_rows()),
        ],
    );
    for (i, p) in presents.iter().enumerate() {
        let n = layer_cache(i);
        let dims = |value| cache_dims(shape, attention, TOTAL_SEQUENCE, value);
        b.output(&p.key, &n.present_key, float, &dims(false));
        b.output(&p.value, &n.present_value, float, &dims(true));
    }
    if let Some(dims) = state_dims(ctx.cfg) {
        for (i, state) in next_states.iter().enumerate() {
            b.output(state, &names::qkv_conv_state(i).1, data_type::FLOAT, &dims);
        }
    }
}
