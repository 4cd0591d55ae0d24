//! Needle 3 geometry, as the `.cact` header records it (generation 3, `cactus-needle==3.2.8`).

use crate::needle::attention::HeadShape;
use crate::needle::context::{EngramGeometry, Geometry, SharedGeometry};

/// Geometry of one Needle 3 model (the validated header; a ladder rung's is the rung's).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab: usize,
    /// Rows of the tied output head (the first `out_vocab` embedding rows); the rest of
    /// `vocab` are input-only. Already resolved: never 0.
    pub out_vocab: usize,
    pub d_model: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub num_layers: usize,
    /// Head width of queries and keys (RoPE, the score scale).
    pub qk_head_dim: usize,
    /// Head width of values and of the attention output.
    pub v_head_dim: usize,
    pub max_seq_len: usize,
    /// Monarch MLP width: `d_model` rounded up to a power of two.
    pub hada_n: usize,
    pub mhc_lanes: usize,
    /// Keys a local layer sees (`query_pos - key_pos < sliding_window`); 0: every layer global.
    pub sliding_window: usize,
    /// Layers with full causal attention; the others use `sliding_window`.
    pub global_layers: Vec<usize>,
    /// Width of the causal depthwise conv over the raw Q, K and V projections; 0 = none.
    pub qkv_conv_taps: usize,
    pub engram_slots: usize,
    pub engram_sub_dim: usize,
    /// `len(engram_orders) * engram_heads`.
    pub num_engram_tables: usize,
    pub engram_conv_taps: usize,
    /// Dilation of the engram value taps: `max(engram_orders)`.
    pub engram_conv_dilation: usize,
    /// Hash seed stride between orders (upstream `engram_seed_heads or heads`), resolved.
    pub engram_seed_stride: usize,
    pub engram_orders: Vec<usize>,
    /// Layers at which the engram memory is added, one per site.
    pub engram_sites: Vec<usize>,
    pub rope_theta: f32,
    /// The file's layers this model keeps: `0..num_layers` for the whole model, the
    /// kept blocks' original indices for a ladder rung.
    pub source_layers: Vec<usize>,
    /// KV window upstream sized the model for (0: none recorded).
    pub kv_window: usize,
    pub kv_bits: u32,
}

impl Config {
    /// The attention heads' layout.
    pub fn head_shape(&self) -> HeadShape {
        HeadShape {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            qk_dim: self.qk_head_dim,
            v_dim: self.v_head_dim,
        }
    }

    /// Width of the raw Q, K and V projections the conv runs over, concatenated.
    pub fn qkv_width(&self) -> usize {
        (self.num_heads + self.num_kv_heads) * self.qk_head_dim
            + self.num_kv_heads * self.v_head_dim
    }

    /// `(slots, width)` of each layer's QKV-conv state: the previous `taps − 1`
    /// positions' raw projections; `None` without the conv.
    pub fn qkv_conv_state(&self) -> Option<(usize, usize)> {
        (self.qkv_conv_taps > 1).then(|| (self.qkv_conv_taps - 1, self.qkv_width()))
    }

    /// The sliding window of layer `layer` when it can bind (shorter than `max_seq_len`).
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        (self.is_local(layer) && self.sliding_window < self.max_seq_len)
            .then_some(self.sliding_window)
    }

    /// Whether layer `layer` attends within `sliding_window` only.
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding_window > 0 && !self.global_layers.contains(&layer)
    }

    /// Engram tables per n-gram order.
    pub fn engram_heads(&self) -> usize {
        self.num_engram_tables / self.engram_orders.len()
    }

    /// Tokens before the first new one that the engram reads (its taps reach back
    /// `conv_taps · dilation` positions).
    pub fn engram_history(&self) -> usize {
        self.engram_conv_taps * self.engram_conv_dilation
    }
}

impl Geometry for Config {
    fn shared(&self) -> SharedGeometry {
        SharedGeometry {
            d_model: self.d_model,
            mhc_lanes: self.mhc_lanes,
            engram: EngramGeometry {
                orders: self.engram_orders.clone(),
                num_tables: self.num_engram_tables,
                slots: self.engram_slots,
                sub_dim: self.engram_sub_dim,
                conv_taps: self.engram_conv_taps,
                dilation: self.engram_conv_dilation,
                seed_stride: self.engram_seed_stride,
            },
        }
    }
}
