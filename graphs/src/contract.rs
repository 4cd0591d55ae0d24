//! The graph contract (`CONTRACT.md` §2): the names of the graph's inputs and outputs,
//! its symbolic dimensions, its `metadata_props` keys, the one spelling of every enum
//! recorded there, and [`ExportDescription`], the typed form of that metadata with one
//! `to_metadata` / `from_metadata`. The exporter writes through it, the runner and the
//! benchmarks read through it; no other file spells a graph name or a metadata key.

use crate::needle::attention::HeadShape;
use crate::needle::Config;
use crate::needle3::Config as Config3;
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
    /// `float32 [batch, sequence, vocab]`.
    pub const LOGITS: &str = "logits";
    /// `float32 [batch]`, a model with a confidence head: the head's logit over this
    /// call's real tokens (a sequence's confidence when it is fed whole, empty cache).
    pub const CONFIDENCE_LOGIT: &str = "confidence_logit";
    /// `float32 [batch, contrastive_dim]`, Needle 2 with a contrastive head: the unit-norm
    /// embedding of this call's real tokens (a sequence's when it is fed whole, empty
    /// cache); cosine similarity is the dot product of two.
    pub const CONTRASTIVE_EMBEDDING: &str = "contrastive_embedding";
    const PAST_KV_PREFIX: &str = "past_key_values.";
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
    /// `graphs::needle::token_history`), so the engram finds each row's last real tokens
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
    /// The index of the cache pair that holds the token history (see
    /// [`super::names::token_history`]): `num_layers`.
    pub const TOKEN_HISTORY: &str = "needle.token_history_layer";
    pub const PAST_PRESENT_SHARE_BUFFER: &str = "needle.past_present_share_buffer";
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

/// A model's geometry, whatever its generation.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelConfig {
    Needle2(Config),
    Needle3(Config3),
}

impl ModelConfig {
    pub fn generation(&self) -> Generation {
        match self {
            ModelConfig::Needle2(_) => Generation::Needle2,
            ModelConfig::Needle3(_) => Generation::Needle3,
        }
    }

    pub fn num_layers(&self) -> usize {
        match self {
            ModelConfig::Needle2(c) => c.num_layers,
            ModelConfig::Needle3(c) => c.num_layers,
        }
    }

    pub fn max_seq_len(&self) -> usize {
        match self {
            ModelConfig::Needle2(c) => c.max_seq_len,
            ModelConfig::Needle3(c) => c.max_seq_len,
        }
    }

    /// Token ids the model reads.
    pub fn vocab(&self) -> usize {
        match self {
            ModelConfig::Needle2(c) => c.vocab,
            ModelConfig::Needle3(c) => c.vocab,
        }
    }

    /// Width of `logits`: the ids the model can produce.
    pub fn output_vocab(&self) -> usize {
        match self {
            ModelConfig::Needle2(c) => c.vocab,
            ModelConfig::Needle3(c) => c.out_vocab,
        }
    }

    /// The attention heads' layout.
    pub fn head_shape(&self) -> HeadShape {
        match self {
            ModelConfig::Needle2(c) => HeadShape::of(c),
            ModelConfig::Needle3(c) => c.head_shape(),
        }
    }

    /// Width of the engram token history state.
    pub fn engram_history(&self) -> usize {
        match self {
            ModelConfig::Needle2(c) => c.engram_history(),
            ModelConfig::Needle3(c) => c.engram_history(),
        }
    }

    /// The keys a windowed layer's query sees, its own among them, when that window binds
    /// (is shorter than `max_seq_len`).
    pub fn sliding_window(&self) -> Option<usize> {
        match self {
            ModelConfig::Needle2(c) => c.sliding_window(),
            ModelConfig::Needle3(c) => (0..c.num_layers).find_map(|l| c.window_of(l)),
        }
    }

    /// `(slots, width)` of each layer's QKV-conv state (Needle 3 with conv taps).
    pub fn qkv_conv_state(&self) -> Option<(usize, usize)> {
        match self {
            ModelConfig::Needle2(_) => None,
            ModelConfig::Needle3(c) => c.qkv_conv_state(),
        }
    }

    fn to_metadata(&self) -> Vec<(String, String)> {
        match self {
            ModelConfig::Needle2(c) => c.to_metadata(),
            ModelConfig::Needle3(c) => c.to_metadata(),
        }
    }

    fn from_metadata(
        generation: Generation,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        Ok(match generation {
            Generation::Needle2 => ModelConfig::Needle2(Config::from_metadata(get)?),
            Generation::Needle3 => ModelConfig::Needle3(Config3::from_metadata(get)?),
        })
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

/// How the weights of the large MatMuls (projections, logits) are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatMulWeights {
    /// Dense, in the graph's precision: the exact model.
    Float,
    /// The `.cact`'s own CQ codes, norms and codebooks, decoded to the dense matrices by
    /// ai.onnx ops on initializers, which onnxruntime folds into float initializers at
    /// session creation: the exact model at about the `.cact`'s size on disk.
    Cq,
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
}

impl Spelled for MatMulWeights {
    const WHAT: &'static str = "weight storage";
    const ALL: &'static [Self] = &[
        MatMulWeights::Float,
        MatMulWeights::Cq,
        MatMulWeights::Int8,
        MatMulWeights::Int4,
    ];
    fn name(self) -> &'static str {
        match self {
            MatMulWeights::Float => "float",
            MatMulWeights::Cq => "cq",
            MatMulWeights::Int8 => "int8",
            MatMulWeights::Int4 => "int4",
        }
    }
}
spelled_traits!(MatMulWeights);

/// The choices that make one graph out of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub attention: AttentionKind,
    pub precision: Precision,
    pub matmul_weights: MatMulWeights,
    pub runtime: RuntimeTarget,
}

/// The `.cact` file a graph was exported from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub file_name: String,
    /// Lowercase hex SHA-256 of the file's bytes.
    pub sha256: String,
}

/// The tokenizer a graph is run with: its file beside the graph, its normalizer rules and
/// the special ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerDescription {
    /// The `tokenizer.json` written beside the graph; `None` for an in-memory export,
    /// which has none.
    pub file: Option<TokenizerFile>,
    /// sentencepiece `add_dummy_prefix`.
    pub add_dummy_prefix: bool,
    /// sentencepiece `remove_extra_whitespaces` (the `.cact` does not record it).
    pub remove_extra_whitespaces: bool,
    pub pad_id: u32,
    pub eos_id: u32,
    pub bos_id: u32,
    pub unk_id: u32,
}

/// The tokenizer file beside a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerFile {
    pub name: String,
    /// Lowercase hex SHA-256 of its bytes; `None` in graphs exported before it was recorded.
    pub sha256: Option<String>,
}

/// Everything an exported graph says about itself in `metadata_props`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportDescription {
    pub config: ModelConfig,
    pub variant: Variant,
    pub source: Source,
    pub tokenizer: TokenizerDescription,
    /// `past_key_values.*` may be buffers longer than `past_sequence`, bound as
    /// `present.*` too, so attention writes only the new positions in place
    /// (onnxruntime-genai's `past_present_share_buffer`).
    pub past_present_share_buffer: bool,
    /// The state inputs besides the KV cache, each fed back from its `present_*` output.
    pub state_inputs: Vec<String>,
    /// The cache pair after the attention layers' that holds the token history
    /// ([`names::token_history`]).
    pub token_history_layer: usize,
    /// Where shorter rows of a batch are padded.
    pub padding_side: PaddingSide,
}

impl ExportDescription {
    /// The description of a new export of `variant`: the fused graph reads the past length
    /// from `attention_mask`, so it takes shared past/present buffers; the reference graph
    /// reads it from the cache's shape, so it does not.
    pub fn new(
        config: ModelConfig,
        variant: Variant,
        source: Source,
        tokenizer: TokenizerDescription,
    ) -> Self {
        let state_inputs = match config.qkv_conv_state() {
            Some(_) => (0..config.num_layers())
                .map(|i| names::qkv_conv_state(i).0)
                .collect(),
            None => Vec::new(),
        };
        ExportDescription {
            token_history_layer: config.num_layers(),
            config,
            variant,
            source,
            tokenizer,
            past_present_share_buffer: variant.attention.is_fused(),
            state_inputs,
            padding_side: PaddingSide::Right,
        }
    }

    pub fn generation(&self) -> Generation {
        self.config.generation()
    }

    /// Whether the graph's attention window depends on the onnxruntime release that runs
    /// it: a fused graph's sliding window is `GroupQueryAttention`'s `local_window_size`,
    /// which the releases of its [`RuntimeTarget`] count as the model does and the others
    /// one key apart.
    pub fn window_depends_on_release(&self) -> bool {
        self.variant.attention.is_fused() && self.config.sliding_window().is_some()
    }

    /// Refuses what the graph cannot express: before onnxruntime 1.24 `GroupQueryAttention`
    /// counts only the keys before the query in `local_window_size` and reads 0 as no
    /// window, so a fused graph for 1.20–1.23 cannot show a query its own key alone.
    pub fn check(&self) -> Result<(), String> {
        let one_key = self.config.sliding_window() == Some(1);
        if one_key
            && self.variant.attention.is_fused()
            && self.variant.runtime == RuntimeTarget::From1_20To1_23
        {
            return Err(format!(
                "a sliding window of 1 key has no GroupQueryAttention form before onnxruntime \
                 1.24: export it with --onnxruntime {} or --attention {}",
                RuntimeTarget::Since1_24,
                AttentionKind::Reference
            ));
        }
        Ok(())
    }

    /// The interface in words, for the model's `doc_string` (what a person reading the
    /// graph in Netron or onnx needs; the metadata says the same as data).
    pub fn doc_string(&self) -> String {
        let history = names::token_history(self.token_history_layer);
        let shape = self.config.head_shape();
        let attention = self.variant.attention;
        let mut doc = format!(
            "Needle {} ({} attention, {}). Inputs: {ids} [{b}, {s}]; {mask} [{b}, {t}], 1 for \
             real tokens, each row's padding after its tokens ({pad} padding); {pos} [{b}, {s}], \
             each token's position in its row; per layer {pk}.key [{b}, {kv}, {p}, {kd}] and \
             .value [{b}, {kv}, {p}, {vd}], for the {layers} attention layers and one more, \
             {history}.key/.value, shaped the same: the token history, each past token's id \
             written where the layers write its key (as id / {split} and id mod {split} in the \
             first two channels of head 0, zeros elsewhere), from which the engram n-gram \
             memory reads each row's last {w} real tokens (so cropping the cache rewinds it \
             too). Outputs: {logits} [{b}, {s}, vocab] float32; {pr}.key/.value [.., {t}, \
             ..] for every pair. For the next step feed every present.* back as its \
             past_key_values.*, append a column to the mask and continue each row's positions; \
             {p} = 0, an all-ones mask and positions 0..{s} is a plain forward.",
            self.generation(),
            self.variant.attention,
            self.variant.precision,
            ids = names::INPUT_IDS,
            mask = names::ATTENTION_MASK,
            pad = self.padding_side,
            pos = names::POSITION_IDS,
            layers = self.config.num_layers(),
            history = history.past_key.trim_end_matches(".key"),
            split = crate::needle::token_history::ID_SPLIT,
            w = self.config.engram_history(),
            kv = shape.kv_heads,
            kd = shape.cached_key_dim(attention),
            vd = shape.cached_value_dim(attention),
            logits = names::LOGITS,
            pk = "past_key_values.{i}",
            pr = "present.{i}",
            b = dims::BATCH,
            s = dims::SEQUENCE,
            p = dims::PAST_SEQUENCE,
            t = dims::TOTAL_SEQUENCE,
        );
        if let Some((slots, width)) = self.config.qkv_conv_state() {
            let (past, present) = names::qkv_conv_state(0);
            doc.push_str(&format!(
                " Per layer also {} [{b}, {slots}, {width}] (.0 for layer 0, and so on): the \
                 raw q, k and v projections of each row's last {slots} real tokens, which the \
                 causal conv over them reads; zeros at the start; returned as {}.",
                past.replace(".0.", ".{i}."),
                present.replace(".0.", ".{i}."),
                b = dims::BATCH,
            ));
        }
        if self.window_depends_on_release() && self.variant.runtime == RuntimeTarget::From1_20To1_23
        {
            doc.push_str(
                " The sliding window is GroupQueryAttention's local_window_size as onnxruntime \
                 1.20 to 1.23 count it: on 1.24 and later a query sees one key fewer.",
            );
        }
        if self.past_present_share_buffer {
            doc.push_str(
                " The KV inputs may be buffers longer than past_sequence (attention_mask gives \
                 the length): bind the same buffer as present.* and attention writes only the \
                 new positions, as onnxruntime-genai's past_present_share_buffer does.",
            );
        }
        doc
    }

    /// The doc string's sentence on the probe-head outputs a graph has (empty without
    /// any): `confidence` when it has `confidence_logit`, the embedding width when it has
    /// `contrastive_embedding`.
    pub fn heads_doc(confidence: bool, contrastive_dim: Option<usize>) -> String {
        let mut doc = String::new();
        if let Some(width) = contrastive_dim {
            doc.push_str(&format!(
                " Also {} float32 [{b}, {width}]: the contrastive head's unit-norm embedding of \
                 this call's real tokens (cosine similarity is the dot product).",
                names::CONTRASTIVE_EMBEDDING,
                b = dims::BATCH,
            ));
        }
        if confidence {
            doc.push_str(&format!(
                " Also {} float32 [{b}]: the confidence head's logit over this call's real tokens.",
                names::CONFIDENCE_LOGIT,
                b = dims::BATCH,
            ));
        }
        if !doc.is_empty() {
            doc.push_str(
                " The heads pool over the call's positions: a sequence's values come from feeding \
                 it whole with an empty cache.",
            );
        }
        doc
    }

    /// The description as `metadata_props` entries.
    pub fn to_metadata(&self) -> Vec<(String, String)> {
        let mut meta = vec![(keys::GENERATION.to_string(), self.generation().to_string())];
        meta.extend(self.config.to_metadata());
        let mut add = |k: &str, v: String| meta.push((k.to_string(), v));
        let v = &self.variant;
        add(keys::ATTENTION, v.attention.to_string());
        if let AttentionKind::Fused(op) = v.attention {
            add(keys::FUSED_OP, op.to_string());
        }
        add(
            keys::PAST_PRESENT_SHARE_BUFFER,
            self.past_present_share_buffer.to_string(),
        );
        add(keys::PRECISION, v.precision.to_string());
        add(keys::MATMUL_WEIGHTS, v.matmul_weights.to_string());
        add(keys::ONNXRUNTIME, v.runtime.to_string());
        add(keys::SOURCE_FILE, self.source.file_name.clone());
        add(keys::SOURCE_SHA256, self.source.sha256.clone());
        add(keys::STATE_INPUTS, self.state_inputs.join(","));
        add(keys::TOKEN_HISTORY, self.token_history_layer.to_string());
        add(keys::PADDING_SIDE, self.padding_side.to_string());
        let t = &self.tokenizer;
        if let Some(file) = &t.file {
            add(keys::TOKENIZER, file.name.clone());
            if let Some(sha256) = &file.sha256 {
                add(keys::TOKENIZER_SHA256, sha256.clone());
            }
        }
        add(keys::ADD_DUMMY_PREFIX, t.add_dummy_prefix.to_string());
        add(
            keys::REMOVE_EXTRA_WHITESPACES,
            t.remove_extra_whitespaces.to_string(),
        );
        add(keys::PAD_ID, t.pad_id.to_string());
        add(keys::EOS_ID, t.eos_id.to_string());
        add(keys::BOS_ID, t.bos_id.to_string());
        add(keys::UNK_ID, t.unk_id.to_string());
        meta
    }

    /// Reads the description back; `get` looks a key up. The error names the missing or
    /// malformed key.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let read = Metadata(&get);
        if get(keys::GENERATION).is_none() {
            return Err(format!(
                "metadata key {} is missing: an export from before position_ids and the \
                 per-row engram state (batch-exact graphs); export it again",
                keys::GENERATION
            ));
        }
        if get(keys::TOKEN_HISTORY).is_none() {
            return Err(format!(
                "metadata key {} is missing: an export from before the token history moved \
                 into the KV cache; export it again",
                keys::TOKEN_HISTORY
            ));
        }
        let config = ModelConfig::from_metadata(read.spelled(keys::GENERATION)?, &get)?;
        let attention = match read.spelled::<AttentionKind>(keys::ATTENTION)? {
            AttentionKind::Fused(_) => AttentionKind::Fused(read.spelled(keys::FUSED_OP)?),
            AttentionKind::Reference => AttentionKind::Reference,
        };
        Ok(ExportDescription {
            config,
            variant: Variant {
                attention,
                precision: read.spelled(keys::PRECISION)?,
                matmul_weights: read.spelled(keys::MATMUL_WEIGHTS)?,
                // Graphs exported before the key were all written for onnxruntime 1.24.
                runtime: match get(keys::ONNXRUNTIME) {
                    None => RuntimeTarget::Since1_24,
                    Some(_) => read.spelled(keys::ONNXRUNTIME)?,
                },
            },
            source: Source {
                file_name: read.text(keys::SOURCE_FILE)?,
                sha256: read.text(keys::SOURCE_SHA256)?,
            },
            tokenizer: TokenizerDescription {
                file: get(keys::TOKENIZER).map(|name| TokenizerFile {
                    name,
                    sha256: get(keys::TOKENIZER_SHA256),
                }),
                add_dummy_prefix: read.parsed(keys::ADD_DUMMY_PREFIX)?,
                remove_extra_whitespaces: read.parsed(keys::REMOVE_EXTRA_WHITESPACES)?,
                pad_id: read.parsed(keys::PAD_ID)?,
                eos_id: read.parsed(keys::EOS_ID)?,
                bos_id: read.parsed(keys::BOS_ID)?,
                unk_id: read.parsed(keys::UNK_ID)?,
            },
            past_present_share_buffer: read.parsed(keys::PAST_PRESENT_SHARE_BUFFER)?,
            state_inputs: read.names(keys::STATE_INPUTS)?,
            token_history_layer: read.parsed(keys::TOKEN_HISTORY)?,
            padding_side: read.spelled(keys::PADDING_SIDE)?,
        })
    }
}

/// Typed reads of `metadata_props`, each error naming its key.
struct Metadata<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Metadata<'_, F> {
    fn text(&self, key: &str) -> Result<String, String> {
        (self.0)(key).ok_or_else(|| format!("metadata key {key} is missing"))
    }

    fn parsed<T: FromStr>(&self, key: &str) -> Result<T, String> {
        let text = self.text(key)?;
        text.parse()
            .map_err(|_| format!("metadata key {key} has the malformed value {text:?}"))
    }

    fn spelled<T: Spelled>(&self, key: &str) -> Result<T, String> {
        parse_spelled(&self.text(key)?).map_err(|e| format!("metadata key {key}: {e}"))
    }

    fn names(&self, key: &str) -> Result<Vec<String>, String> {
        let text = self.text(key)?;
        Ok(text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect())
    }

    fn list(&self, key: &str) -> Result<Vec<usize>, String> {
        let text = self.text(key)?;
        if text.is_empty() {
            return Ok(Vec::new());
        }
        text.split(',')
            .map(|x| {
                x.parse()
                    .map_err(|_| format!("metadata key {key} is not a list of numbers"))
            })
            .collect()
    }
}

impl Config {
    /// The geometry as `metadata_props` entries (lists comma-separated).
    pub fn to_metadata(&self) -> Vec<(String, String)> {
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

    /// Reads the geometry back from metadata; `get` looks a key up. The error names the
    /// missing or malformed key.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let read = Metadata(&get);
        Ok(Config {
            vocab: read.parsed(keys::VOCAB)?,
            d_model: read.parsed(keys::D_MODEL)?,
            num_heads: read.parsed(keys::NUM_HEADS)?,
            num_kv_heads: read.parsed(keys::NUM_KV_HEADS)?,
            num_layers: read.parsed(keys::NUM_LAYERS)?,
            head_dim: read.parsed(keys::HEAD_DIM)?,
            max_seq_len: read.parsed(keys::MAX_SEQ_LEN)?,
            hada_n: read.parsed(keys::HADA_N)?,
            mhc_lanes: read.parsed(keys::MHC_LANES)?,
            engram_slots: read.parsed(keys::ENGRAM_SLOTS)?,
            engram_sub_dim: read.parsed(keys::ENGRAM_SUB_DIM)?,
            num_engram_tables: read.parsed(keys::ENGRAM_TABLES)?,
            engram_conv_taps: read.parsed(keys::ENGRAM_CONV_TAPS)?,
            engram_conv_dilation: read.parsed(keys::ENGRAM_CONV_DILATION)?,
            engram_orders: read.list(keys::ENGRAM_ORDERS)?,
            engram_sites: read.list(keys::ENGRAM_SITES)?,
            rope_theta: read.parsed(keys::ROPE_THETA)?,
            kv_window: read.parsed(keys::KV_WINDOW)?,
            kv_bits: read.parsed(keys::KV_BITS)?,
        })
    }
}

impl Config3 {
    /// The geometry as `metadata_props` entries (lists comma-separated).
    pub fn to_metadata(&self) -> Vec<(String, String)> {
        [
            (keys::VOCAB, self.vocab.to_string()),
            (keys::OUT_VOCAB, self.out_vocab.to_string()),
            (keys::D_MODEL, self.d_model.to_string()),
            (keys::NUM_HEADS, self.num_heads.to_string()),
            (keys::NUM_KV_HEADS, self.num_kv_heads.to_string()),
            (keys::NUM_LAYERS, self.num_layers.to_string()),
            (keys::QK_HEAD_DIM, self.qk_head_dim.to_string()),
            (keys::V_HEAD_DIM, self.v_head_dim.to_string()),
            (keys::MAX_SEQ_LEN, self.max_seq_len.to_string()),
            (keys::HADA_N, self.hada_n.to_string()),
            (keys::MHC_LANES, self.mhc_lanes.to_string()),
            (keys::SLIDING_WINDOW, self.sliding_window.to_string()),
            (keys::GLOBAL_LAYERS, list(&self.global_layers)),
            (keys::QKV_CONV_TAPS, self.qkv_conv_taps.to_string()),
            (keys::ENGRAM_SLOTS, self.engram_slots.to_string()),
            (keys::ENGRAM_SUB_DIM, self.engram_sub_dim.to_string()),
            (keys::ENGRAM_TABLES, self.num_engram_tables.to_string()),
            (keys::ENGRAM_CONV_TAPS, self.engram_conv_taps.to_string()),
            (
                keys::ENGRAM_CONV_DILATION,
                self.engram_conv_dilation.to_string(),
            ),
            (
                keys::ENGRAM_SEED_STRIDE,
                self.engram_seed_stride.to_string(),
            ),
            (keys::SOURCE_LAYERS, list(&self.source_layers)),
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

    /// Reads the geometry back from metadata; the error names the missing or malformed key.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Result<Config3, String> {
        let read = Metadata(&get);
        Ok(Config3 {
            vocab: read.parsed(keys::VOCAB)?,
            out_vocab: read.parsed(keys::OUT_VOCAB)?,
            d_model: read.parsed(keys::D_MODEL)?,
            num_heads: read.parsed(keys::NUM_HEADS)?,
            num_kv_heads: read.parsed(keys::NUM_KV_HEADS)?,
            num_layers: read.parsed(keys::NUM_LAYERS)?,
            qk_head_dim: read.parsed(keys::QK_HEAD_DIM)?,
            v_head_dim: read.parsed(keys::V_HEAD_DIM)?,
            max_seq_len: read.parsed(keys::MAX_SEQ_LEN)?,
            hada_n: read.parsed(keys::HADA_N)?,
            mhc_lanes: read.parsed(keys::MHC_LANES)?,
            sliding_window: read.parsed(keys::SLIDING_WINDOW)?,
            global_layers: read.list(keys::GLOBAL_LAYERS)?,
            qkv_conv_taps: read.parsed(keys::QKV_CONV_TAPS)?,
            engram_slots: read.parsed(keys::ENGRAM_SLOTS)?,
            engram_sub_dim: read.parsed(keys::ENGRAM_SUB_DIM)?,
            num_engram_tables: read.parsed(keys::ENGRAM_TABLES)?,
            engram_conv_taps: read.parsed(keys::ENGRAM_CONV_TAPS)?,
            engram_conv_dilation: read.parsed(keys::ENGRAM_CONV_DILATION)?,
            engram_seed_stride: read.parsed(keys::ENGRAM_SEED_STRIDE)?,
            source_layers: read.list(keys::SOURCE_LAYERS)?,
            engram_orders: read.list(keys::ENGRAM_ORDERS)?,
            engram_sites: read.list(keys::ENGRAM_SITES)?,
            rope_theta: read.parsed(keys::ROPE_THETA)?,
            kv_window: read.parsed(keys::KV_WINDOW)?,
            kv_bits: read.parsed(keys::KV_BITS)?,
        })
    }
}

/// `v` comma-separated.
fn list(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

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

    fn description(attention: AttentionKind) -> ExportDescription {
        let config = Config {
            vocab: 11,
            d_model: 8,
            num_heads: 2,
            num_kv_heads: 1,
            num_layers: 3,
            head_dim: 4,
            max_seq_len: 32,
            hada_n: 8,
            mhc_lanes: 2,
            engram_slots: 5,
            engram_sub_dim: 2,
            num_engram_tables: 4,
            engram_conv_taps: 2,
            engram_conv_dilation: 3,
            engram_orders: vec![2, 3],
            engram_sites: vec![],
            rope_theta: 1.0e4,
            kv_window: 0,
            kv_bits: 8,
        };
        let variant = Variant {
            attention,
            precision: Precision::Fp16,
            matmul_weights: MatMulWeights::Int4,
            runtime: RuntimeTarget::From1_20To1_23,
        };
        let source = Source {
            file_name: "m.cact".into(),
            sha256: "ab".repeat(32),
        };
        let tokenizer = TokenizerDescription {
            file: Some(TokenizerFile {
                name: "m.tokenizer.json".into(),
                sha256: Some("cd".repeat(32)),
            }),
            add_dummy_prefix: true,
            remove_extra_whitespaces: false,
            pad_id: 0,
            eos_id: 1,
            bos_id: 2,
            unk_id: 3,
        };
        ExportDescription::new(ModelConfig::Needle2(config), variant, source, tokenizer)
    }

    #[test]
    fn metadata_reads_back_as_written() {
        for attention in AttentionKind::ALL {
            let d = description(*attention);
            let meta: std::collections::HashMap<_, _> = d.to_metadata().into_iter().collect();
            assert_eq!(
                ExportDescription::from_metadata(|k| meta.get(k).cloned()),
                Ok(d)
            );
        }
    }

    #[test]
    fn an_export_from_before_the_generation_key_is_told_to_export_again() {
        let mut meta: std::collections::HashMap<_, _> = description(AttentionKind::FUSED)
            .to_metadata()
            .into_iter()
            .collect();
        meta.remove(keys::GENERATION);
        let err = ExportDescription::from_metadata(|k| meta.get(k).cloned()).unwrap_err();
        assert!(err.contains("export it again"), "{err}");
    }

    #[test]
    fn an_export_from_before_the_onnxruntime_key_was_written_for_1_24() {
        let mut meta: std::collections::HashMap<_, _> = description(AttentionKind::FUSED)
            .to_metadata()
            .into_iter()
            .collect();
        meta.remove(keys::ONNXRUNTIME);
        let read = ExportDescription::from_metadata(|k| meta.get(k).cloned()).unwrap();
        assert_eq!(read.variant.runtime, RuntimeTarget::Since1_24);
    }

    #[test]
    fn only_a_fused_graph_for_1_20_refuses_a_one_key_window() {
        for (window, attention, runtime, refused) in [
            (1, AttentionKind::FUSED, RuntimeTarget::From1_20To1_23, true),
            (
                2,
                AttentionKind::FUSED,
                RuntimeTarget::From1_20To1_23,
                false,
            ),
            (1, AttentionKind::FUSED, RuntimeTarget::Since1_24, false),
            (
                1,
                AttentionKind::Reference,
                RuntimeTarget::From1_20To1_23,
                false,
            ),
        ] {
            let mut d = description(attention);
            d.variant.runtime = runtime;
            let ModelConfig::Needle2(c) = &mut d.config else {
                unreachable!()
            };
            c.kv_window = window;
            assert_eq!(
                d.check().is_err(),
                refused,
                "{window} {attention} {runtime}"
            );
        }
    }

    #[test]
    fn a_missing_or_misspelled_key_is_named() {
        let meta: std::collections::HashMap<_, _> = description(AttentionKind::FUSED)
            .to_metadata()
            .into_iter()
            .collect();
        let without = |key: &str| {
            ExportDescription::from_metadata(|k| (k != key).then(|| meta[k].clone())).unwrap_err()
        };
        assert_eq!(
            without(keys::PRECISION),
            "metadata key needle.precision is missing"
        );
        let wrong = ExportDescription::from_metadata(|k| match k {
            keys::ATTENTION => Some("flash".into()),
            _ => meta.get(k).cloned(),
        });
        assert!(wrong.unwrap_err().contains("needle.attention"));
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
    }
}
