//! Needle 3 geometry, as the `.cact` header records it (generation 3,
//! `cactus-needle==3.2.8`), and its metadata form.

use crate::contract::{keys, HeadShape};
use crate::geometry::{CommonGeometry, Geometry};
use crate::metadata::{Field, GeometryFields};

/// Geometry of one Needle 3 model (the validated header; a ladder rung's is the rung's).
/// `common.kv_window` is recorded only: Needle 3 attends within `sliding_window`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub common: CommonGeometry,
    /// Rows of the tied output head (the first `out_vocab` embedding rows); the rest of
    /// `vocab` are input-only. Already resolved: never 0.
    pub out_vocab: usize,
    /// Head width of queries and keys (RoPE, the score scale).
    pub qk_head_dim: usize,
    /// Head width of values and of the attention output.
    pub v_head_dim: usize,
    /// Keys a local layer sees (`query_pos - key_pos < sliding_window`); 0: every layer global.
    pub sliding_window: usize,
    /// Layers with full causal attention; the others use `sliding_window`.
    pub global_layers: Vec<usize>,
    /// Width of the causal depthwise conv over the raw Q, K and V projections; 0 = none.
    pub qkv_conv_taps: usize,
    /// The file's layers this model keeps: `0..num_layers` for the whole model, the
    /// kept blocks' original indices for a ladder rung.
    pub source_layers: Vec<usize>,
}

impl Config {
    /// Width of the raw Q, K and V projections the conv runs over, concatenated.
    pub fn qkv_width(&self) -> usize {
        let c = &self.common;
        (c.num_heads + c.num_kv_heads) * self.qk_head_dim + c.num_kv_heads * self.v_head_dim
    }

    /// `(slots, width)` of each layer's QKV-conv state: the previous `taps − 1`
    /// positions' raw projections; `None` without the conv.
    pub fn qkv_conv_state(&self) -> Option<(usize, usize)> {
        (self.qkv_conv_taps > 1).then(|| (self.qkv_conv_taps - 1, self.qkv_width()))
    }

    /// The sliding window of layer `layer` when it can bind (shorter than `max_seq_len`).
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        (self.is_local(layer) && self.sliding_window < self.common.max_seq_len)
            .then_some(self.sliding_window)
    }

    /// Whether layer `layer` attends within `sliding_window` only.
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding_window > 0 && !self.global_layers.contains(&layer)
    }
}

impl Geometry for Config {
    fn common(&self) -> &CommonGeometry {
        &self.common
    }

    fn head_shape(&self) -> HeadShape {
        HeadShape {
            heads: self.common.num_heads,
            kv_heads: self.common.num_kv_heads,
            qk_dim: self.qk_head_dim,
            v_dim: self.v_head_dim,
        }
    }
}

impl GeometryFields for Config {
    fn fields(&mut self) -> Vec<(&'static str, Field<'_>)> {
        let c = &mut self.common;
        let e = &mut c.engram;
        vec![
            (keys::VOCAB, Field::Count(&mut c.vocab)),
            (keys::OUT_VOCAB, Field::Count(&mut self.out_vocab)),
            (keys::D_MODEL, Field::Count(&mut c.d_model)),
            (keys::NUM_HEADS, Field::Count(&mut c.num_heads)),
            (keys::NUM_KV_HEADS, Field::Count(&mut c.num_kv_heads)),
            (keys::NUM_LAYERS, Field::Count(&mut c.num_layers)),
            (keys::QK_HEAD_DIM, Field::Count(&mut self.qk_head_dim)),
            (keys::V_HEAD_DIM, Field::Count(&mut self.v_head_dim)),
            (keys::MAX_SEQ_LEN, Field::Count(&mut c.max_seq_len)),
            (keys::HADA_N, Field::Count(&mut c.hada_n)),
            (keys::MHC_LANES, Field::Count(&mut c.mhc_lanes)),
            (keys::SLIDING_WINDOW, Field::Count(&mut self.sliding_window)),
            (keys::GLOBAL_LAYERS, Field::Counts(&mut self.global_layers)),
            (keys::QKV_CONV_TAPS, Field::Count(&mut self.qkv_conv_taps)),
            (keys::ENGRAM_SLOTS, Field::Count(&mut e.slots)),
            (keys::ENGRAM_SUB_DIM, Field::Count(&mut e.sub_dim)),
            (keys::ENGRAM_TABLES, Field::Count(&mut e.num_tables)),
            (keys::ENGRAM_CONV_TAPS, Field::Count(&mut e.conv_taps)),
            (keys::ENGRAM_CONV_DILATION, Field::Count(&mut e.dilation)),
            (keys::ENGRAM_SEED_STRIDE, Field::Count(&mut e.seed_stride)),
            (keys::SOURCE_LAYERS, Field::Counts(&mut self.source_layers)),
            (keys::ENGRAM_ORDERS, Field::Counts(&mut e.orders)),
            (keys::ENGRAM_SITES, Field::Counts(&mut e.sites)),
            (keys::ROPE_THETA, Field::Real(&mut c.rope_theta)),
            (keys::KV_WINDOW, Field::Count(&mut c.kv_window)),
            (keys::KV_BITS, Field::Bits(&mut c.kv_bits)),
        ]
    }
}
