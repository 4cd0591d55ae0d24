//! The graph contract: the names of the graph's inputs and outputs, its symbolic
//! dimensions, its `metadata_props` keys, the one spelling of every enum recorded there,
//! the cache layout ([`HeadShape`]) and the token history's id split. A leaf: it imports
//! none of the model modules. The exporter writes through it, the runner and the
//! benchmarks read through it; no other file spells a graph name or a metadata key.
//! The typed form of the whole metadata is `crate::description::ExportDescription`.

use std::fmt;
use std::str::FromStr;

/// Graph input and output names.
pub mod names {
    /// `int64 [batch, sequence]`.
    pub const INPUT_IDS: &str = "input_ids";
    /// `int64 [batch, total_sequence]`, 1 for real tokens; padding on the right of each
    /// row's tokens (see [`super::PaddingSide`]).
    pub const ATTENTION_MASK: &str = "attention_mask";
    /// `int64 [batch, sequence]`: each token's position in its own row (0 for the row's
    /// first real token); drives RoPE, the engram's validity and the reference mask.
    pub const POSITION_IDS: &str = "position_ids";
    /// `float32 [batch, sequence, vocab]`; in the packed graphs `[batch, logits_sequence,
    /// vocab]`, the last [`LOGITS_TO_KEEP`] positions.
    pub const LOGITS: &str = "logits";
    /// Packed graphs (`--weights packed`): an optional `int64` scalar, 0 unless fed (an
    /// initializer of the same name holds the default), as Hugging Face's
    /// `logits_to_keep`: the logits of the call's last `logits_to_keep` positions only,
    /// of every position when 0 (or more than the call has). A prompt needs the logits of
    /// its last token alone, and the output head over every position was 7% of a Needle 2
    /// prefill and its largest tensor.
    pub const LOGITS_TO_KEEP: &str = "logits_to_keep";
    /// `float32 [batch]`, a model with a confidence head: the head's logit over this
    /// call's real tokens (a sequence's confidence when it is fed whole, empty cache).
    pub const CONFIDENCE_LOGIT: &str = "confidence_logit";
    /// Graphs with the Needle ops and a confidence head (`keys::CONFIDENCE_POOLS`):
    /// `float32 [batch, pools, d_model + 2]`, the head's running pools over the row's
    /// tokens before this call (zeros before the first; `kernels/src/probe_pool.rs`), and
    /// after it: `confidence_logit` is then the head's logit over every token the row has
    /// fed, not this call's alone.
    pub const PAST_CONFIDENCE_POOLS: &str = "past_confidence_pools";
    pub const PRESENT_CONFIDENCE_POOLS: &str = "present_confidence_pools";
    /// `float32 [batch, contrastive_dim]`, Needle 2 with a contrastive head: the unit-norm
    /// embedding of this call's real tokens (a sequence's when it is fed whole, empty
    /// cache); cosine similarity is the dot product of two.
    pub const CONTRASTIVE_EMBEDDING: &str = "contrastive_embedding";
    /// Accelerator graphs (`crate::accelerator`): `int32 [batch, engram_history +
    /// sequence]`, the row's `engram_history` tokens before this call (0 where it has
    /// none), then this call's `sequence` tokens (0 after the row's last in a prompt's
    /// final chunk).
    pub const TOKEN_WINDOW: &str = "token_window";
    /// Accelerator graphs whose cache is a ring (`keys::CACHE_RING`): `int32 [batch,
    /// cache_capacity]`, the position of the token each slot holds (any value where
    /// `attention_mask` says the slot holds none).
    pub const CACHE_POSITIONS: &str = "cache_positions";
    const NEW_KV_PREFIX: &str = "new_key_values.";
    const PAST_KV_PREFIX: &str = "past_key_values.";

    /// Accelerator graphs, Needle 3 with the QKV conv: layer `i`'s raw Q, K and V
    /// projections of this call's tokens, `new_key_values.{i}.qkv_conv`
    /// `[batch, sequence, q + k + v width]`; the caller's next `past_key_values.{i}.qkv_conv`
    /// is the row's last `qkv_conv_taps − 1` of them (real tokens only).
    pub fn new_state(i: usize) -> String {
        format!("{NEW_KV_PREFIX}{i}.qkv_conv")
    }

    /// Accelerator graphs: layer `i`'s keys and values of this call's tokens,
    /// `new_key_values.{i}.key` / `.value` `[batch, num_kv_heads, sequence, head_dim]`,
    /// which the caller writes into its fixed-capacity cache at the tokens' positions.
    pub fn new_key_values(i: usize) -> (String, String) {
        (
            format!("{NEW_KV_PREFIX}{i}.key"),
            format!("{NEW_KV_PREFIX}{i}.value"),
        )
    }
    const PRESENT_KV_PREFIX: &str = "present.";

    /// The cache inputs and outputs of one layer.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct LayerCache {
        /// `past_key_values.{i}.key`, `[batch, num_kv_heads, past_sequence, head_dim]`.
        pub past_key: String,
        pub past_value: String,
        /// `present.{i}.key`, `[batch, num_kv_heads, total_sequence, head_dim]`.
        pub present_key: String,
        pub present_value: String,
    }

    /// The token history: one more cache pair after the attention layers,
    /// `past_key_values.{L}.key/.value` (`L` = num_layers), shaped like theirs. Each token
    /// of a row writes its id where the layers write its key (see
    /// `crate::blocks::token_history`), so the engram finds each row's last real tokens
    /// there, and whoever crops or rewinds the KV cache (onnxruntime-genai's `rewind_to`)
    /// crops the history with it.
    pub fn token_history(num_layers: usize) -> LayerCache {
        layer_cache(num_layers)
    }

    /// Needle 3's QKV-conv state of layer `i`: `past_key_values.{i}.qkv_conv` /
    /// `present.{i}.qkv_conv`, `[batch, qkv_conv_taps − 1, q + k + v width]`, each row's
    /// raw projections of its last real tokens (oldest first), zeros at the start.
    pub fn qkv_conv_state(i: usize) -> (String, String) {
        (
            format!("{PAST_KV_PREFIX}{i}.qkv_conv"),
            format!("{PRESENT_KV_PREFIX}{i}.qkv_conv"),
        )
    }

    /// The cache names of layer `i`.
    pub fn layer_cache(i: usize) -> LayerCache {
        layer_cache_named(&i.to_string())
    }

    /// The cache names with `%d` for the layer, as onnxruntime-genai's config takes them.
    pub fn layer_cache_template() -> LayerCache {
        layer_cache_named("%d")
    }

    fn layer_cache_named(layer: &str) -> LayerCache {
        LayerCache {
            past_key: format!("{PAST_KV_PREFIX}{layer}.key"),
            past_value: format!("{PAST_KV_PREFIX}{layer}.value"),
            present_key: format!("{PRESENT_KV_PREFIX}{layer}.key"),
            present_value: format!("{PRESENT_KV_PREFIX}{layer}.value"),
        }
    }
}

/// Symbolic dimension names.
pub mod dims {
    pub const BATCH: &str = "batch";
    pub const SEQUENCE: &str = "sequence";
    pub const PAST_SEQUENCE: &str = "past_sequence";
    /// `past_sequence + sequence`.
    pub const TOTAL_SEQUENCE: &str = "total_sequence";
    /// The engram history followed by the new tokens: `engram_history + sequence`.
    pub const ENGRAM_WINDOW: &str = "engram_window";
    /// The packed graphs' logits positions: `min(sequence, logits_to_keep)`, or
    /// `sequence` where `logits_to_keep` is 0.
    pub const LOGITS_SEQUENCE: &str = "logits_sequence";
}

/// `metadata_props` keys.
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
    // Needle 3's geometry besides the keys above (`head_dim` is not written for it).
    pub const OUT_VOCAB: &str = "needle.out_vocab";
    pub const QK_HEAD_DIM: &str = "needle.qk_head_dim";
    pub const V_HEAD_DIM: &str = "needle.v_head_dim";
    pub const SLIDING_WINDOW: &str = "needle.sliding_window";
    pub const GLOBAL_LAYERS: &str = "needle.global_layers";
    pub const QKV_CONV_TAPS: &str = "needle.qkv_conv_taps";
    pub const ENGRAM_SEED_STRIDE: &str = "needle.engram_seed_stride";
    /// The source file's layers a graph keeps (a ladder rung keeps some).
    pub const SOURCE_LAYERS: &str = "needle.source_layers";
    pub const GENERATION: &str = "needle.generation";
    pub const PADDING_SIDE: &str = "needle.padding_side";
    pub const ATTENTION: &str = "needle.attention";
    pub const FUSED_OP: &str = "needle.fused_op";
    pub const ONNXRUNTIME: &str = "needle.onnxruntime";
    pub const PRECISION: &str = "needle.precision";
    pub const MATMUL_WEIGHTS: &str = "needle.matmul_weights";
    pub const SOURCE_FILE: &str = "needle.source_file";
    pub const SOURCE_SHA256: &str = "needle.source_sha256";
    pub const STATE_INPUTS: &str = "needle.state_inputs";
    /// The number of running pools of the confidence head a graph carries between calls
    /// (`names::PAST_CONFIDENCE_POOLS`); absent where it carries none.
    pub const CONFIDENCE_POOLS: &str = "needle.confidence_pools";
    /// The index of the cache pair that holds the token history (see
    /// [`super::names::token_history`]): `num_layers`.
    pub const TOKEN_HISTORY: &str = "needle.token_history_layer";
    pub const PAST_PRESENT_SHARE_BUFFER: &str = "needle.past_present_share_buffer";
    /// An accelerator graph's execution provider (`super::AcceleratorTarget`), its cache
    /// capacity, whether the cache is a ring (`true`: position `p` in slot `p mod
    /// capacity`, the graph reading `names::CACHE_POSITIONS`; `false` or absent: slot `p`)
    /// and the fixed number of tokens it takes per call.
    pub const TARGET: &str = "needle.target";
    pub const CACHE_CAPACITY: &str = "needle.cache_capacity";
    pub const CACHE_RING: &str = "needle.cache_ring";
    pub const FIXED_SEQUENCE: &str = "needle.fixed_sequence";
    pub const TOKENIZER: &str = "needle.tokenizer";
    /// Lowercase hex SHA-256 of the tokenizer file's bytes, so a runtime can tell it is
    /// the file the graph was exported with.
    pub const TOKENIZER_SHA256: &str = "needle.tokenizer_sha256";
    pub const ADD_DUMMY_PREFIX: &str = "needle.add_dummy_prefix";
    pub const REMOVE_EXTRA_WHITESPACES: &str = "needle.remove_extra_whitespaces";
    pub const PAD_ID: &str = "needle.pad_token_id";
    pub const EOS_ID: &str = "needle.eos_token_id";
    pub const BOS_ID: &str = "needle.bos_token_id";
    pub const UNK_ID: &str = "needle.unk_token_id";
}

/// An enum with exactly one spelling per value, in metadata and on the command line.
pub trait Spelled: Copy + PartialEq + 'static {
    /// What the values describe, for error messages (`attention variant`).
    const WHAT: &'static str;
    /// Every value, in the order the command line lists them.
    const ALL: &'static [Self];
    /// The value's spelling.
    fn name(self) -> &'static str;
}

/// A string that is no value's spelling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    pub what: &'static str,
    pub found: String,
    pub expected: Vec<&'static str>,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a {} (expected {})",
            self.found,
            self.what,
            self.expected.join(", ")
        )
    }
}

impl std::error::Error for UnknownName {}

/// The value spelled `name`.
pub fn parse_spelled<T: Spelled>(name: &str) -> Result<T, UnknownName> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == name)
        .ok_or_else(|| UnknownName {
            what: T::WHAT,
            found: name.to_string(),
            expected: T::ALL.iter().map(|v| v.name()).collect(),
        })
}

/// Declares `Display` and `FromStr` from a [`Spelled`] impl.
macro_rules! spelled_traits {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
        impl FromStr for $t {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, UnknownName> {
                parse_spelled(s)
            }
        }
    };
}

/// The model generation a graph implements (`.cact` tag `0x05E12A83` is Needle 2,
/// `0x05E12A84` Needle 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generation {
    /// `cactus-needle==2.0.15`.
    Needle2,
    /// `cactus-needle==3.2.8`.
    Needle3,
}

impl Spelled for Generation {
    const WHAT: &'static str = "model generation";
    const ALL: &'static [Self] = &[Generation::Needle2, Generation::Needle3];
    fn name(self) -> &'static str {
        match self {
            Generation::Needle2 => "2",
            Generation::Needle3 => "3",
        }
    }
}

spelled_traits!(Generation);

/// Where a batch's shorter rows have their padding (mask 0, any token id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PaddingSide {
    /// After each row's real tokens, as onnxruntime-genai pads a batch: a row's tokens
    /// are its first columns in a prefill, and each step appends one column to every row.
    Right,
}

impl Spelled for PaddingSide {
    const WHAT: &'static str = "padding side";
    const ALL: &'static [Self] = &[PaddingSide::Right];
    fn name(self) -> &'static str {
        match self {
            PaddingSide::Right => "right",
        }
    }
}
spelled_traits!(PaddingSide);

/// onnxruntime's fused attention kernel the fused variant uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// `com.microsoft.GroupQueryAttention`: GQA with an in-place-capable BNSH cache.
    GroupQueryAttention,
}

impl Spelled for FusedOp {
    const WHAT: &'static str = "fused attention op";
    const ALL: &'static [Self] = &[FusedOp::GroupQueryAttention];
    fn name(self) -> &'static str {
        match self {
            FusedOp::GroupQueryAttention => "com.microsoft.GroupQueryAttention",
        }
    }
}
spelled_traits!(FusedOp);

/// Which attention core the graph uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// onnxruntime's fused kernel (`fused`), with the single-kernel norms and RoPE its
    /// [`RuntimeTarget`] has.
    Fused(FusedOp),
    /// A MatMul/Softmax subgraph on opset 21, default ai.onnx domain only (`reference`).
    Reference,
}

impl AttentionKind {
    /// The fused variant with its default op.
    pub const FUSED: AttentionKind = AttentionKind::Fused(FusedOp::GroupQueryAttention);

    /// True for either fused op.
    pub fn is_fused(self) -> bool {
        matches!(self, AttentionKind::Fused(_))
    }
}

impl Spelled for AttentionKind {
    const WHAT: &'static str = "attention variant";
    const ALL: &'static [Self] = &[AttentionKind::FUSED, AttentionKind::Reference];
    fn name(self) -> &'static str {
        match self {
            AttentionKind::Fused(_) => "fused",
            AttentionKind::Reference => "reference",
        }
    }
}
spelled_traits!(AttentionKind);

/// The onnxruntime releases a graph is written for, spelled by the oldest of them. They
/// differ in what the fused graph may use: the opset-23 `RMSNormalization` and
/// `RotaryEmbedding` kernels (IR 11) from 1.23 on, and what `GroupQueryAttention`'s
/// `local_window_size` counts, which changed in 1.24 (PR 25927). The reference graph is the
/// same for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeTarget {
    /// onnxruntime 1.24 and later (`1.24`): opset 23 with its single-kernel norms and RoPE.
    Since1_24,
    /// onnxruntime 1.20 to 1.23 (`1.20`): IR 10 and opset 21, `com.microsoft` RoPE, and the
    /// window as those releases count it, so a fused graph whose sliding window binds is
    /// one key narrower on 1.24 and later.
    From1_20To1_23,
}

impl Spelled for RuntimeTarget {
    const WHAT: &'static str = "onnxruntime target";
    const ALL: &'static [Self] = &[RuntimeTarget::Since1_24, RuntimeTarget::From1_20To1_23];
    fn name(self) -> &'static str {
        match self {
            RuntimeTarget::Since1_24 => "1.24",
            RuntimeTarget::From1_20To1_23 => "1.20",
        }
    }
}
spelled_traits!(RuntimeTarget);

/// Floating-point element type of the model's weights and activations (logits stay float32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    Fp32,
    Fp16,
}

impl Spelled for Precision {
    const WHAT: &'static str = "precision";
    const ALL: &'static [Self] = &[Precision::Fp32, Precision::Fp16];
    fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
        }
    }
}
spelled_traits!(Precision);

/// The Needle op domain: kernels of our own, which an onnxruntime session gets from
/// `needle-run` (in process) or from the kernels library (`register_custom_ops_library`).
pub mod needle_ops {
    /// The domain of every Needle op.
    pub const DOMAIN: &str = "needle";
    /// `Y = X · Wᵀ` for a CQ matrix kept as codes (`kernels/src/cq_matmul/mod.rs`).
    pub const CQ_MATMUL: &str = "CqMatMul";
    /// Rows of a CQ matrix decoded as they are gathered (`kernels/src/cq_matmul/rows.rs`).
    pub const CQ_GATHER: &str = "CqGather";
    /// An engram site's value: its projection and dilated conv, projecting only the rows
    /// a tap reads (`kernels/src/engram_value.rs`).
    pub const ENGRAM_VALUE: &str = "EngramValue";
    /// An engram site's gated addition to the block input (`kernels/src/engram_gate.rs`).
    pub const ENGRAM_GATE: &str = "EngramGate";
    /// An engram site's n-gram rows of a token window: the hash, the CQ rows decoded and
    /// the rows of n-grams that start before the first valid token zeroed
    /// (`kernels/src/engram_rows.rs`).
    pub const ENGRAM_ROWS: &str = "EngramRows";
    /// The hyper-connections' Sinkhorn mix in one kernel (`kernels/src/sinkhorn.rs`): what
    /// packed graphs written before [`HYPER_CONNECTIONS_OUT`] took it over still run.
    pub const SINKHORN: &str = "Sinkhorn";
    /// A layer's block input from the hyper-connections' lanes
    /// (`kernels/src/hyper_connections.rs`).
    pub const HYPER_CONNECTIONS_IN: &str = "HyperConnectionsIn";
    /// The lanes' update from a layer's block output, its Sinkhorn mix included.
    pub const HYPER_CONNECTIONS_OUT: &str = "HyperConnectionsOut";
    /// Needle 3's Monarch MLP of one layer in one kernel (`kernels/src/monarch_mlp.rs`).
    pub const MONARCH_MLP: &str = "MonarchMlp";
    /// Needle 2's Hadamard MLP of one layer in one kernel (`kernels/src/hadamard_mlp.rs`).
    pub const HADAMARD_MLP: &str = "HadamardMlp";
    /// A sandwich norm's gated residual add, `x + scale · norm(h)` (`kernels/src/residual_norm.rs`).
    pub const RESIDUAL_NORM: &str = "ResidualNorm";
    /// Needle 3's query, key and value heads from a layer's projections, packed side by side
    /// for `GroupQueryAttention`: QKV conv, query and key norm and RoPE, padding to the
    /// core's head width (`kernels/src/attention_heads.rs`).
    pub const QKV_HEADS: &str = "QkvHeads";
    /// Needle 3's probe-head pooling over the hidden cells, per layer, the softmax over
    /// the tokens carried as running pools (`kernels/src/probe_pool.rs`).
    pub const PROBE_POOL: &str = "ProbePool";
    /// Needle 2's probe-head pooling over every cell of every layer at once, carried the
    /// same way (`kernels::probe_pool::joint_pool`).
    pub const JOINT_PROBE_POOL: &str = "JointProbePool";
    /// Needle 3's next QKV-conv state: each row's last real positions of the conv's window
    /// (`kernels/src/conv_state.rs`): what packed graphs written before [`QKV_HEADS`] gave
    /// it as a second output still run.
    pub const CONV_STATE: &str = "ConvState";
    /// Attention's output heads unpadded and gated by the sigmoid of the layer's gate
    /// projection (`kernels/src/attention_gate.rs`).
    pub const ATTENTION_GATE: &str = "AttentionGate";
    /// [`ATTENTION_GATE`] and the layer's output projection (a [`CQ_MATMUL`] of the gated
    /// heads) in one kernel (`kernel-ops/src/attention_gate.rs`): what packed graphs
    /// written before it ran as two nodes still run.
    pub const ATTENTION_OUT: &str = "AttentionOut";
    /// Grouped-query attention over each row's cache within the layer's window, appending
    /// this call's keys and values in place (`kernels/src/attention.rs`): the packed
    /// graphs' core in place of `GroupQueryAttention`.
    pub const ATTENTION: &str = "Attention";
}

/// How the weights of the large MatMuls (projections, logits) are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatMulWeights {
    /// Dense, in the graph's precision: the exact model.
    Float,
    /// The `.cact`'s own CQ codes, norms and codebooks, decoded to the dense matrices by
    /// ai.onnx ops on initializers, which onnxruntime folds into float initializers at
    /// session creation: the exact model at about the `.cact`'s size on disk.
    Cq,
    /// The `.cact`'s CQ codes, norms and codebooks as the graph's initializers, multiplied
    /// as codes by [`needle_ops::CQ_MATMUL`] (a custom op: onnxruntime with the Needle
    /// kernels loaded): the exact model at the `.cact`'s size on disk and in memory.
    Packed,
    /// `com.microsoft.MatMulNBits`, symmetric 8-bit blocks of 32 along K.
    Int8,
    /// `com.microsoft.MatMulNBits`, symmetric 4-bit blocks of 32 along K.
    Int4,
}

impl MatMulWeights {
    /// Re-quantized into `MatMulNBits` blocks (approximate), rather than exact.
    pub fn is_block_quantized(self) -> bool {
        matches!(self, MatMulWeights::Int8 | MatMulWeights::Int4)
    }

    /// Keeps the `.cact`'s CQ codes in the graph (tables' rows decoded as gathered).
    pub fn keeps_codes(self) -> bool {
        matches!(self, MatMulWeights::Cq | MatMulWeights::Packed)
    }
}

impl Spelled for MatMulWeights {
    const WHAT: &'static str = "weight storage";
    const ALL: &'static [Self] = &[
        MatMulWeights::Float,
        MatMulWeights::Cq,
        MatMulWeights::Packed,
        MatMulWeights::Int8,
        MatMulWeights::Int4,
    ];
    fn name(self) -> &'static str {
        match self {
            MatMulWeights::Float => "float",
            MatMulWeights::Cq => "cq",
            MatMulWeights::Packed => "packed",
            MatMulWeights::Int8 => "int8",
            MatMulWeights::Int4 => "int4",
        }
    }
}
spelled_traits!(MatMulWeights);

/// The execution provider an accelerator graph (`needle-export --target`) is for. One
/// static-shape graph serves all three; the target is recorded for the runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcceleratorTarget {
    CoreMl,
    Nnapi,
    TensorRt,
}

impl Spelled for AcceleratorTarget {
    const WHAT: &'static str = "accelerator target";
    const ALL: &'static [Self] = &[
        AcceleratorTarget::CoreMl,
        AcceleratorTarget::Nnapi,
        AcceleratorTarget::TensorRt,
    ];
    fn name(self) -> &'static str {
        match self {
            AcceleratorTarget::CoreMl => "coreml",
            AcceleratorTarget::Nnapi => "nnapi",
            AcceleratorTarget::TensorRt => "tensorrt",
        }
    }
}
spelled_traits!(AcceleratorTarget);

/// The choices that make one graph out of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub attention: AttentionKind,
    pub precision: Precision,
    pub matmul_weights: MatMulWeights,
    pub runtime: RuntimeTarget,
}

/// The head layout of one attention: `heads` query heads of width `qk_dim` over
/// `kv_heads` key heads of width `qk_dim` and value heads of width `v_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
}

impl HeadShape {
    /// The head width `GroupQueryAttention` runs at: it takes one width for q, k and v,
    /// a multiple of 8 on the CPU, so the heads are zero-padded to the wider one rounded up
    /// to 8 (upstream's flash path pads to the wider too), which leaves every score and
    /// output unchanged.
    pub fn fused_dim(self) -> usize {
        self.qk_dim.max(self.v_dim).next_multiple_of(8)
    }

    /// Width of the cached keys in `attention`'s variant.
    pub fn cached_key_dim(self, attention: AttentionKind) -> usize {
        match attention {
            AttentionKind::Fused(_) => self.fused_dim(),
            AttentionKind::Reference => self.qk_dim,
        }
    }

    /// Width of the cached values in `attention`'s variant.
    pub fn cached_value_dim(self, attention: AttentionKind) -> usize {
        match attention {
            AttentionKind::Fused(_) => self.fused_dim(),
            AttentionKind::Reference => self.v_dim,
        }
    }
}

/// The token history ([`names::token_history`]) keeps each id in two channels:
/// ids are stored as `id / ID_SPLIT` and `id mod ID_SPLIT`, both below 2048, which fp16
/// holds exactly (so any vocabulary below 2²¹ ids survives an fp16 cache).
pub const ID_SPLIT: i64 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Spelled + fmt::Display + FromStr<Err = UnknownName> + fmt::Debug>() {
        for v in T::ALL {
            assert_eq!(v.to_string().parse::<T>().unwrap(), *v);
        }
        let err = "nonsense".parse::<T>().unwrap_err();
        assert!(err.to_string().contains(T::ALL[0].name()), "{err}");
    }

    #[test]
    fn every_enum_has_one_spelling_both_ways() {
        round_trips::<Generation>();
        round_trips::<PaddingSide>();
        round_trips::<AttentionKind>();
        round_trips::<FusedOp>();
        round_trips::<Precision>();
        round_trips::<MatMulWeights>();
        round_trips::<RuntimeTarget>();
        round_trips::<AcceleratorTarget>();
    }
}
