//! Needle 2's part of the stream (`crate::stream`): its attention (one head width, one
//! window for every layer), the Hadamard MLP, and the contrastive and confidence heads.

use crate::blocks::attention::{CoreInputs, KvPair};
use crate::blocks::context::BuildContext;
use crate::blocks::norms::ZcNormed;
use crate::builder::{GraphBuilder, Value};
use crate::needle2::attention::{attention, attention_ctx, AttentionCtx};
use crate::needle2::hadamard_mlp::{hadamard_mlp, hadamard_mlp_op};
use crate::needle2::heads::{confidence_logit, contrastive_embedding, Pools};
use crate::needle2::{Config, LayerWeights, Weights};
use crate::stream::{Architecture, BlockNorms, Heads, Inputs, SplitMask, StreamWeights};

impl Architecture for Config {
    type Weights = Weights;
    type LayerWeights = LayerWeights;
    type Attention = AttentionCtx;
    type MlpConstants = ();

    fn stream_weights(w: &Weights) -> StreamWeights<'_> {
        StreamWeights {
            embedding: &w.embedding,
            mhc: &w.mhc,
            engrams: &w.engrams,
            final_norm: &w.final_norm,
        }
    }

    fn layers(w: &Weights) -> &[LayerWeights] {
        &w.layers
    }

    fn block_norms(w: &LayerWeights) -> BlockNorms<'_> {
        BlockNorms {
            norm_in: &w.norm_in,
            post_norm: &w.post_norm,
            attn_gate: &w.attn_gate,
            pre_hada: &w.pre_hada,
        }
    }

    fn layer_state(&self) -> Option<(usize, usize)> {
        None
    }

    fn output_rows(&self) -> usize {
        self.common.vocab
    }

    fn attention_inputs(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        inputs: &Inputs,
        _masks: &SplitMask,
    ) -> AttentionCtx {
        attention_ctx(b, ctx, &inputs.mask, &inputs.position_ids)
    }

    fn history_core(attention: &AttentionCtx) -> &CoreInputs {
        &attention.core
    }

    fn mlp_constants(_b: &mut GraphBuilder, _ctx: &BuildContext<Config>, _w: &Weights) {}

    fn attention(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        attn: &AttentionCtx,
        _layer: usize,
        x: &ZcNormed,
        w: &LayerWeights,
        past: &KvPair,
        _state: Option<&Value>,
    ) -> (Value, KvPair, Option<Value>) {
        let (out, present) = attention(b, ctx, attn, x, w, past);
        (out, present, None)
    }

    fn mlp(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        _constants: &(),
        x: &Value,
        w: &LayerWeights,
    ) -> Value {
        hadamard_mlp(b, ctx, x, w)
    }

    fn mlp_op(
        b: &mut GraphBuilder,
        _constants: &(),
        x: &Value,
        gain: &Value,
        w: &LayerWeights,
    ) -> Value {
        hadamard_mlp_op(b, x, gain, w)
    }

    fn has_heads(w: &Weights) -> bool {
        w.contrastive.is_some() || w.confidence.is_some()
    }

    fn heads(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        w: &Weights,
        cells: &[Value],
        keep: &Value,
        past_pools: Option<&Value>,
    ) -> Heads {
        let (one_call, confidence_pools) = match (ctx.kernels.needle_ops, past_pools) {
            (false, _) => (Pools::Stock, Pools::Stock),
            (true, None) => (Pools::OneCall, Pools::OneCall),
            (true, Some(past)) => (Pools::OneCall, Pools::Carried(past)),
        };
        let contrastive = w.contrastive.as_ref().map(|head| {
            let embedding = b.scope("contrastive_head", |b| {
                contrastive_embedding(b, cells, keep, head, one_call)
            });
            (embedding, head.proj.shape[0])
        });
        let confidence = w.confidence.as_ref().map(|head| {
            b.scope("confidence_head", |b| {
                confidence_logit(b, cells, keep, head, confidence_pools)
            })
        });
        let (confidence, confidence_pools) = match confidence {
            Some((logit, pools)) => (Some(logit), pools),
            None => (None, None),
        };
        Heads {
            contrastive,
            confidence,
            confidence_pools,
        }
    }
}
