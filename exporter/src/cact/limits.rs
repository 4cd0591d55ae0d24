//! The largest value each header field may have. A field that sizes no tensor still sizes
//! something the graph builds (the RoPE tables are `max_seq_len` rows, the engram window
//! `conv_taps × dilation` tokens, an n-gram hash `order` steps), and a file's length
//! bounds only what it stores; so every field has a bound, checked before anything is
//! sized from it. Each bound is a generous multiple of upstream's geometry
//! (`cactus-needle` 2.0.15 and 3.2.8 `TransformerConfig` defaults in brackets): it
//! refuses no model upstream can train while keeping every derived size small (the
//! largest RoPE table `MAX_SEQ_LEN × MAX_HEAD_DIM / 2` floats, 32 MiB each for sin and
//! cos). The README's contract section lists them.

/// `(field, most)` for every field a bound applies to, in either generation's header
/// (a generation checks the ones its layout has).
pub const FIELD_LIMITS: [(&str, u32); 21] = [
    // Tokens: [16384]; the vocabulary is also bounded by the embedding's bytes.
    ("vocab", 1 << 20),
    ("out_vocab", 1 << 20),
    ("d_model", 1 << 14),       // [768]
    ("num_heads", 256),         // [12]
    ("num_kv_heads", 256),      // [a divisor of num_heads]
    ("num_layers", 256),        // [20; Needle 3's mask names 64 at most]
    ("head_dim", MAX_HEAD_DIM), // [64]
    ("qk_head_dim", MAX_HEAD_DIM),
    ("v_head_dim", MAX_HEAD_DIM),
    ("max_seq_len", MAX_SEQ_LEN),    // [4096]
    ("kv_window", MAX_SEQ_LEN),      // [a window within the sequence]
    ("sliding_window", MAX_SEQ_LEN), // [1024]
    ("hada_n", 1 << 14),             // [d_model rounded up to a power of two]
    ("mhc_lanes", 16),               // [4; the Sinkhorn is lanes² per step]
    ("qkv_conv_taps", 16),           // [3]
    ("engram_slots", 1 << 24),       // [18432]
    ("engram_sub_dim", 1 << 12),
    ("num_engram_tables", 64),      // [orders × heads]
    ("engram_conv_taps", 16),       // [4]
    ("engram_conv_dilation", 16),   // [max(orders) = 3]
    ("engram_seed_heads", 1 << 16), // [0 = heads per order]
];

/// Longest sequence a graph is built for (upstream: 4096).
pub const MAX_SEQ_LEN: u32 = 1 << 16;
/// Widest attention head (upstream: 64).
pub const MAX_HEAD_DIM: u32 = 256;
/// Highest n-gram order of an engram hash (upstream: 2 and 3).
pub const MAX_ENGRAM_ORDER: u32 = 16;
