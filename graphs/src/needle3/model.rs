//! Needle 3's part of the stream (`crate::stream`): split head widths, the QKV conv and
//! its state, local and global layers, the Monarch MLP with its two permutations, and
//! the confidence head; the tied head is limited to `out_vocab` rows.

use crate::blocks::attention::{core_inputs, rope, CoreInputs, KvPair};
use crate::blocks::context::BuildContext;
use crate::blocks::norms::ZcNormed;
use crate::builder::{GraphBuilder, Value};
use crate::needle3::attention::{attention, AttentionCtx, LayerPast};
use crate::needle3::confidence::confidence_logit;
use crate::needle3::monarch_mlp::{monarch_mlp, monarch_mlp_op, permutations};
use crate::needle3::{Config, LayerWeights, Weights};
use crate::stream::{Architecture, BlockNorms, Heads, Inputs, SplitMask, StreamWeights};

impl Architecture for Config {
    type Weights = Weights;
    type LayerWeights = LayerWeights;
    type Attention = AttentionCtx;
    /// The Monarch MLP's permutations, shared by every layer.
    type MlpConstants = [Value; 2];

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
        self.qkv_conv_state()
    }

    fn output_rows(&self) -> usize {
        self.out_vocab
    }

    fn attention_inputs(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        inputs: &Inputs,
        masks: &SplitMask,
    ) -> AttentionCtx {
        let cfg = ctx.cfg;
        let rope = rope(
            b,
            ctx,
            cfg.qk_head_dim,
            cfg.common.max_seq_len,
            cfg.common.rope_theta,
            &inputs.position_ids,
        );
        // Global layers see every earlier key; local ones (if any) their window.
        let window = (0..cfg.common.num_layers).find_map(|l| cfg.window_of(l));
        let windows: Vec<Option<usize>> = std::iter::once(None).chain(window.map(Some)).collect();
        let mut cores =
            core_inputs(b, ctx, &inputs.mask, &inputs.position_ids, &windows).into_iter();
        let global = cores.next().expect("the global core");
        let local = cores.next();
        let real_new = b.reduce_sum(&masks.new, &[1], true);
        let real_new = b.unsqueeze(&real_new, &[2]);
        AttentionCtx {
            rope,
            global,
            local,
            real_new: Some(real_new),
        }
    }

    fn history_core(attention: &AttentionCtx) -> &CoreInputs {
        &attention.global
    }

    fn mlp_constants(b: &mut GraphBuilder, ctx: &BuildContext<Config>, w: &Weights) -> [Value; 2] {
        let forms = ctx.kernels.op_forms;
        b.scope("hadamard_mlp", |b| {
            [
                permutations(b, forms, &w.hada_p1),
                permutations(b, forms, &w.hada_p2),
            ]
        })
    }

    fn attention(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        attn: &AttentionCtx,
        layer: usize,
        x: &ZcNormed,
        w: &LayerWeights,
        past: &KvPair,
        state: Option<&Value>,
    ) -> (Value, KvPair, Option<Value>) {
        let past = LayerPast {
            kv: past,
            conv: state,
        };
        attention(b, ctx, attn, layer, x, w, past)
    }

    fn mlp(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        [p1, p2]: &[Value; 2],
        x: &Value,
        w: &LayerWeights,
    ) -> Value {
        monarch_mlp(
            b,
            ctx.kernels.op_forms,
            x,
            &w.mlp,
            [p1, p2],
            ctx.common.d_model,
        )
    }

    fn mlp_op(
        b: &mut GraphBuilder,
        [p1, p2]: &[Value; 2],
        x: &Value,
        gain: &Value,
        w: &LayerWeights,
    ) -> Value {
        monarch_mlp_op(b, x, gain, &w.mlp, [p1, p2])
    }

    fn has_heads(w: &Weights) -> bool {
        w.confidence.is_some()
    }

    /// Needle 3 files have no contrastive head; the confidence head is exported.
    fn heads(
        b: &mut GraphBuilder,
        ctx: &BuildContext<Config>,
        w: &Weights,
        cells: &[Value],
        keep: &Value,
        past_pools: Option<&Value>,
    ) -> Heads {
        let head = w.confidence.as_ref().map(|head| {
            b.scope("confidence_head", |b| {
                confidence_logit(b, ctx, cells, keep, head, past_pools)
            })
        });
        let (confidence, confidence_pools) = match head {
            Some((logit, pools)) => (Some(logit), pools),
            None => (None, None),
        };
        Heads {
            contrastive: None,
            confidence,
            confidence_pools,
        }
    }
}
