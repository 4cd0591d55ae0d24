//! Needle 3 `SimpleAttentionNetwork.__call__` with a KV cache, from `input_ids` to
//! `logits`. Same stream as Needle 2's (`needle/model.rs`): embedding ·√d over `lanes`
//! hyper-connection lanes, per layer `hc_pre` → engram (at its sites) → block → `hc_post`,
//! lane mean, `final_norm`, the tied head limited to `out_vocab` rows. What differs is in
//! the block ([`block`]): split head widths, the QKV conv and its state, local and
//! global layers, and the Monarch MLP.
//!
//! ```text
//! input_ids ─embed·√d─ lanes ─┬─ layer 0 … layer L−1 ─ mean ─ final_norm ─ ·E[:out_vocab]ᵀ ─▶ logits
//! token history ++ ids ───────┘   (each layer: KV cache, QKV-conv state; the history: one more cache pair)
//! ```

use crate::builder::{Dim, GraphBuilder, Value};
use crate::contract::dims::{BATCH, SEQUENCE, TOTAL_SEQUENCE};
use crate::contract::names;
use crate::contract::ExportDescription;
use crate::needle::attention::{core_inputs, rope, KvPair};
use crate::needle::engram::{self, EngramKv};
use crate::needle::hyper_connections::{hc_post, hc_pre};
use crate::needle::model::{
    embed_tokens, engram_window, head_outputs, ids_dims, kv_cache_inputs, lm_head,
    logits_and_cache_outputs, split_mask,
};
use crate::needle::norms::zc_rms_norm;
use crate::needle::token_history;
use crate::needle::BuildContext;
use crate::needle3::attention::{attention, AttentionCtx, LayerPast};
use crate::needle3::confidence::confidence_logit;
use crate::needle3::monarch_mlp::monarch_mlp;
use crate::needle3::{Config, LayerWeights, Weights};
use crate::onnx::{data_type, ModelProto};

/// Builds the Needle 3 graph `desc` describes, with its metadata.
pub fn build(desc: &ExportDescription, cfg: &Config, w: &Weights) -> ModelProto {
    let ctx = BuildContext::new(cfg, desc.variant);
    let mut b = GraphBuilder::new(ctx.kernels.opset(), desc.variant.precision);
    let inputs = inputs(&mut b, &ctx);
    let masks = b.scope("new_mask", |b| {
        split_mask(b, &inputs.mask, &inputs.input_ids)
    });
    let attn = b.scope("attn_ctx", |b| {
        let rope = rope(
            b,
            &ctx,
            cfg.qk_head_dim,
            cfg.max_seq_len,
            cfg.rope_theta,
            &inputs.position_ids,
        );
        // Global layers see every earlier key; local ones (if any) their window.
        let window = (0..cfg.num_layers).find_map(|l| cfg.window_of(l));
        let windows: Vec<Option<usize>> = std::iter::once(None).chain(window.map(Some)).collect();
        let mut cores =
            core_inputs(b, &ctx, &inputs.mask, &inputs.position_ids, &windows).into_iter();
        let global = cores.next().expect("the global core");
        let local = cores.next();
        let real_new = b.reduce_sum(&masks.new, &[1], true);
        let real_new = b.unsqueeze(&real_new, &[2]);
        AttentionCtx {
            rope,
            global,
            local,
            real_new,
        }
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
    let permutations = b.scope("hadamard_mlp", |b| {
        [b.const_i64(&w.hada_p1), b.const_i64(&w.hada_p2)]
    });

    let (embedding, mut x) = b.scope("embed_tokens", |b| {
        embed_tokens(b, &ctx, &w.embedding, &inputs.input_ids)
    });
    // The confidence head's cells: the scaled embedding (one lane of the stream, exactly),
    // then each layer's lane mean.
    let mut cells = Vec::new();
    if w.confidence.is_some() {
        let x0 = b.slice(&x, 2, 0, 1);
        cells.push(b.squeeze(&x0, &[2]));
    }
    let mut presents = Vec::with_capacity(w.layers.len());
    let mut next_convs = Vec::with_capacity(w.layers.len());
    for i in 0..w.layers.len() {
        let layer_in = LayerInputs {
            attn: &attn,
            engram_kv: &engram_kv,
            past: &inputs.pasts[i],
            conv_past: inputs.conv_pasts.get(i),
            permutations: [&permutations[0], &permutations[1]],
        };
        let (next, present, conv) = b.scope(format!("layers.{i}"), |b| {
            layer(b, &ctx, &layer_in, &x, w, i)
        });
        x = next;
        if w.confidence.is_some() {
            let mean = b.reduce_mean(&x, &[2]);
            cells.push(b.squeeze(&mean, &[2]));
        }
        presents.push(present);
        next_convs.extend(conv);
    }
    presents.push(b.scope("token_history", |b| {
        let attention = desc.variant.attention;
        let shape = cfg.head_shape();
        token_history::append(
            b,
            &attn.global,
            attention,
            history,
            &inputs.input_ids,
            shape,
        )
    }));
    let confidence = w.confidence.as_ref().map(|head| {
        b.scope("confidence_head", |b| {
            confidence_logit(b, &ctx, &cells, &masks.new, head)
        })
    });
    let logits = b.scope("lm_head", |b| {
        lm_head(
            b,
            &ctx,
            &w.final_norm,
            &w.embedding,
            embedding.as_ref(),
            cfg.out_vocab,
            &x,
        )
    });
    outputs(&mut b, &ctx, &logits, &presents, &next_convs);
    let doc = head_outputs(&mut b, desc, None, confidence.as_ref());
    b.finish("needle", doc, desc.to_metadata())
}

/// The graph inputs, in the contract's order.
struct Inputs {
    input_ids: Value,
    mask: Value,
    position_ids: Value,
    pasts: Vec<KvPair>,
    /// Each layer's QKV-conv state (empty without the conv).
    conv_pasts: Vec<Value>,
}

fn conv_dims(ctx: &BuildContext<Config>) -> Option<[Dim; 3]> {
    let (slots, width) = ctx.cfg.qkv_conv_state()?;
    Some([Dim::Named(BATCH), Dim::Fixed(slots), Dim::Fixed(width)])
}

fn inputs(b: &mut GraphBuilder, ctx: &BuildContext<Config>) -> Inputs {
    let input_ids = b.input(names::INPUT_IDS, data_type::INT64, &ids_dims(SEQUENCE));
    let mask = b.input(
        names::ATTENTION_MASK,
        data_type::INT64,
        &ids_dims(TOTAL_SEQUENCE),
    );
    let position_ids = b.input(names::POSITION_IDS, data_type::INT64, &ids_dims(SEQUENCE));
    let pasts = kv_cache_inputs(b, ctx, ctx.cfg.head_shape(), ctx.cfg.num_layers + 1);
    let conv_pasts = match conv_dims(ctx) {
        Some(dims) => (0..ctx.cfg.num_layers)
            .map(|i| b.input(&names::qkv_conv_state(i).0, data_type::FLOAT, &dims))
            .collect(),
        None => Vec::new(),
    };
    Inputs {
        input_ids,
        mask,
        position_ids,
        pasts,
        conv_pasts,
    }
}

/// What one layer reads besides the stream.
struct LayerInputs<'a> {
    attn: &'a AttentionCtx,
    engram_kv: &'a [EngramKv],
    past: &'a KvPair,
    conv_past: Option<&'a Value>,
    permutations: [&'a Value; 2],
}

/// Layer `i`: `hc_pre` → engram (at its sites) → [`block`] → `hc_post`.
fn layer(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    inputs: &LayerInputs<'_>,
    x: &Value,
    w: &Weights,
    i: usize,
) -> (Value, KvPair, Option<Value>) {
    let (u, mix) = hc_pre(b, ctx, x, &w.mhc, i);
    let site = ctx.cfg.engram_sites.iter().position(|&s| s == i);
    let bx = match site {
        Some(s) => b.scope(format!("engrams.{s}"), |b| {
            engram::inject(b, ctx, &u, &inputs.engram_kv[s])
        }),
        None => u.clone(),
    };
    let (out, present, conv) = block(b, ctx, inputs, i, &bx, &w.layers[i]);
    let y = b.sub(&out, &u);
    (hc_post(b, ctx, x, &y, &mix), present, conv)
}

/// Needle 3 `Block`: `x + σ(attn_gate)·post_norm(attn(norm_in x))`, then
/// `+ monarch_mlp(pre_hada x)`.
fn block(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    inputs: &LayerInputs<'_>,
    layer: usize,
    x: &Value,
    w: &LayerWeights,
) -> (Value, KvPair, Option<Value>) {
    let h = zc_rms_norm(b, ctx, x, "norm_in", &w.norm_in.data);
    let (h, kv, conv) = b.scope("self_attn", |b| {
        attention(
            b,
            ctx,
            inputs.attn,
            layer,
            &h,
            w,
            LayerPast {
                kv: inputs.past,
                conv: inputs.conv_past,
            },
        )
    });
    let h = zc_rms_norm(b, ctx, &h, "post_attn_norm", &w.post_norm.data);
    let gate = 1.0 / (1.0 + (-w.attn_gate.data[0]).exp());
    let gate = b.weight("attn_gate_sigmoid", &[1], &[gate]);
    let h = b.mul(&gate, &h);
    let x = b.add(x, &h);
    let h = zc_rms_norm(b, ctx, &x, "pre_hada_norm", &w.pre_hada.data);
    let h = b.scope("hadamard_mlp", |b| {
        monarch_mlp(b, &h, &w.mlp, inputs.permutations, ctx.cfg.d_model)
    });
    (b.add(&x, &h), kv, conv)
}

/// The graph outputs, in the contract's order.
fn outputs(
    b: &mut GraphBuilder,
    ctx: &BuildContext<Config>,
    logits: &Value,
    presents: &[KvPair],
    next_convs: &[Value],
) {
    let shape = ctx.cfg.head_shape();
    logits_and_cache_outputs(b, ctx, shape, logits, ctx.cfg.out_vocab, presents);
    if let Some(dims) = conv_dims(ctx) {
        for (i, c) in next_convs.iter().enumerate() {
            b.output(c, &names::qkv_conv_state(i).1, data_type::FLOAT, &dims);
        }
    }
}
