//! The geometry both generations share, which each generation's `Config` holds as its
//! `common` field, and what the shared blocks (`crate::blocks`) read of a config.

use crate::contract::HeadShape;

/// The geometry Needle 2 and Needle 3 have in common (the `.cact` header, validated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommonGeometry {
    /// Token ids the model reads (rows of the embedding table).
    pub vocab: usize,
    pub d_model: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub num_layers: usize,
    pub max_seq_len: usize,
    /// The MLP width: `d_model` rounded up to a power of two.
    pub hada_n: usize,
    /// Hyper-connection lanes of the residual stream.
    pub mhc_lanes: usize,
    pub engram: EngramGeometry,
    pub rope_theta: f32,
    /// The KV window upstream sized the model for (0: none). Needle 2 attends within it
    /// (keys with `query_pos - key_pos < kv_window` are visible); Needle 3 records it only.
    pub kv_window: usize,
    pub kv_bits: u32,
}

/// The engram n-gram memory's geometry (see `crate::blocks::engram`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngramGeometry {
    pub orders: Vec<usize>,
    /// Layers at which the memory is added, one per site.
    pub sites: Vec<usize>,
    /// `len(orders) * heads`.
    pub num_tables: usize,
    pub slots: usize,
    pub sub_dim: usize,
    pub conv_taps: usize,
    /// Dilation of the value taps: `max(orders)`.
    pub dilation: usize,
    /// Hash seeds of order `o`, head `h` are `SEED · (o·stride + h + 1)`: `heads` in
    /// Needle 2, `engram_seed_heads` (when set) in Needle 3.
    pub seed_stride: usize,
}

impl EngramGeometry {
    /// Tables per order.
    pub fn heads(&self) -> usize {
        self.num_tables / self.orders.len()
    }

    /// Tokens before the first new one that the n-grams and taps reach back (the width
    /// of the token history the engram reads).
    pub fn history(&self) -> usize {
        self.conv_taps * self.dilation
    }
}

/// A generation's config, as the shared blocks and the stream skeleton see it.
pub trait Geometry {
    fn common(&self) -> &CommonGeometry;

    /// The attention heads' layout.
    fn head_shape(&self) -> HeadShape;
}
