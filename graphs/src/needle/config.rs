//! Model geometry, as the `.cact` header records it (its metadata form is in `contract`).

/// Geometry of one Needle 2 model (the `.cact` header, already validated).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub num_layers: usize,
    pub head_dim: usize,
    pub max_seq_len: usize,
    /// Hadamard MLP width: `d_model` rounded up to a power of two.
    pub hada_n: usize,
    pub mhc_lanes: usize,
    pub engram_slots: usize,
    pub engram_sub_dim: usize,
    /// `len(engram_orders) * engram_heads`.
    pub num_engram_tables: usize,
    pub engram_conv_taps: usize,
    /// Dilation of the engram value taps: `max(engram_orders)`.
    pub engram_conv_dilation: usize,
    pub engram_orders: Vec<usize>,
    /// Layers at which the engram memory is added.
    pub engram_sites: Vec<usize>,
    pub rope_theta: f32,
    /// Sliding attention window the model was trained with (keys with
    /// `query_pos - key_pos < kv_window` are visible); 0 means unlimited.
    pub kv_window: usize,
    pub kv_bits: u32,
}

impl Config {
    /// Tokens before the first new one that the engram reads from the token history (its
    /// taps reach back `conv_taps · dilation` positions).
    pub fn engram_history(&self) -> usize {
        self.engram_conv_taps * self.engram_conv_dilation
    }

    /// The sliding window when it can bind (shorter than `max_seq_len`).
    pub fn sliding_window(&self) -> Option<usize> {
        (self.kv_window > 0 && self.kv_window < self.max_seq_len).then_some(self.kv_window)
    }
}
