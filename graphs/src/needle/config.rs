//! Model geometry, as the `.cact` header records it.

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

/// Metadata keys (in `metadata_props`) of the geometry.
pub mod keys {
    pub const VOCAB: &str = "needle.vocab_size";
    pub const D_MODEL: &str = "needle.d_model";
    pub const NUM_HEADS: &str = "needle.num_heads";
    pub const NUM_KV_HEADS: &str = "needle.num_kv_heads";
    pub const NUM_LAYERS: &str = "needle.num_layers";
    pub const HEAD_DIM: &str = "needle.head_dim";
    pub const MAX_SEQ_LEN: &str = "needle.max_seq_len";
    pub const HADA_N: &str = "needle.hada_n";
    pub const MHC_LANES: &str = "needle.mhc_lanes";
    pub const ENGRAM_SLOTS: &str = "needle.engram_slots";
    pub const ENGRAM_SUB_DIM: &str = "needle.engram_sub_dim";
    pub const ENGRAM_TABLES: &str = "needle.engram_tables";
    pub const ENGRAM_CONV_TAPS: &str = "needle.engram_conv_taps";
    pub const ENGRAM_CONV_DILATION: &str = "needle.engram_conv_dilation";
    pub const ENGRAM_ORDERS: &str = "needle.engram_orders";
    pub const ENGRAM_SITES: &str = "needle.engram_sites";
    pub const ROPE_THETA: &str = "needle.rope_theta";
    pub const KV_WINDOW: &str = "needle.kv_window";
    pub const KV_BITS: &str = "needle.kv_bits";
}

impl Config {
    /// The geometry as `metadata_props` entries (lists comma-separated).
    pub fn to_metadata(&self) -> Vec<(String, String)> {
        let list = |v: &[usize]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        [
            (keys::VOCAB, self.vocab.to_string()),
            (keys::D_MODEL, self.d_model.to_string()),
            (keys::NUM_HEADS, self.num_heads.to_string()),
            (keys::NUM_KV_HEADS, self.num_kv_heads.to_string()),
            (keys::NUM_LAYERS, self.num_layers.to_string()),
            (keys::HEAD_DIM, self.head_dim.to_string()),
            (keys::MAX_SEQ_LEN, self.max_seq_len.to_string()),
            (keys::HADA_N, self.hada_n.to_string()),
            (keys::MHC_LANES, self.mhc_lanes.to_string()),
            (keys::ENGRAM_SLOTS, self.engram_slots.to_string()),
            (keys::ENGRAM_SUB_DIM, self.engram_sub_dim.to_string()),
            (keys::ENGRAM_TABLES, self.num_engram_tables.to_string()),
            (keys::ENGRAM_CONV_TAPS, self.engram_conv_taps.to_string()),
            (
                keys::ENGRAM_CONV_DILATION,
                self.engram_conv_dilation.to_string(),
            ),
            (keys::ENGRAM_ORDERS, list(&self.engram_orders)),
            (keys::ENGRAM_SITES, list(&self.engram_sites)),
            (keys::ROPE_THETA, self.rope_theta.to_string()),
            (keys::KV_WINDOW, self.kv_window.to_string()),
            (keys::KV_BITS, self.kv_bits.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Reads the geometry back from metadata; `get` looks a key up. The error names
    /// the missing or malformed key.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let text = |k: &str| get(k).ok_or_else(|| format!("metadata key {k} is missing"));
        let num = |k: &str| -> Result<usize, String> {
            text(k)?
                .parse()
                .map_err(|_| format!("metadata key {k} is not a number"))
        };
        let list = |k: &str| -> Result<Vec<usize>, String> {
            let t = text(k)?;
            if t.is_empty() {
                return Ok(Vec::new());
            }
            t.split(',')
                .map(|x| {
                    x.parse()
                        .map_err(|_| format!("metadata key {k} is not a list of numbers"))
                })
                .collect()
        };
        Ok(Config {
            vocab: num(keys::VOCAB)?,
            d_model: num(keys::D_MODEL)?,
            num_heads: num(keys::NUM_HEADS)?,
            num_kv_heads: num(keys::NUM_KV_HEADS)?,
            num_layers: num(keys::NUM_LAYERS)?,
            head_dim: num(keys::HEAD_DIM)?,
            max_seq_len: num(keys::MAX_SEQ_LEN)?,
            hada_n: num(keys::HADA_N)?,
            mhc_lanes: num(keys::MHC_LANES)?,
            engram_slots: num(keys::ENGRAM_SLOTS)?,
            engram_sub_dim: num(keys::ENGRAM_SUB_DIM)?,
            num_engram_tables: num(keys::ENGRAM_TABLES)?,
            engram_conv_taps: num(keys::ENGRAM_CONV_TAPS)?,
            engram_conv_dilation: num(keys::ENGRAM_CONV_DILATION)?,
            engram_orders: list(keys::ENGRAM_ORDERS)?,
            engram_sites: list(keys::ENGRAM_SITES)?,
            rope_theta: text(keys::ROPE_THETA)?
                .parse()
                .map_err(|_| format!("metadata key {} is not a number", keys::ROPE_THETA))?,
            kv_window: num(keys::KV_WINDOW)?,
            kv_bits: num(keys::KV_BITS)? as u32,
        })
    }
}
