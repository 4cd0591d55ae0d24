//! [`ExportDescription`]: everything an exported graph says about itself, the typed form
//! of its `metadata_props` (keys and spellings from `crate::contract`), with one
//! `to_metadata` / `from_metadata` and the interface in words for its `doc_string`.

use crate::config::ModelConfig;
use crate::contract::{
    dims, keys, names, AttentionKind, Generation, MatMulWeights, PaddingSide, RuntimeTarget,
    Variant, ID_SPLIT,
};
use crate::metadata::Metadata;

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
    /// The confidence head's running pools a graph carries between calls
    /// (`names::PAST_CONFIDENCE_POOLS`, the last of [`Self::state_inputs`]), `[batch, this,
    /// d_model + 2]`; `None` where the head pools one call's tokens.
    pub confidence_pools: Option<usize>,
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
            confidence_pools: None,
            padding_side: PaddingSide::Right,
        }
    }

    /// The description with the confidence head's `pools` (`None`: the model has no such
    /// head) carried between calls where the graph pools with the Needle ops.
    pub fn with_confidence_pools(mut self, pools: Option<usize>) -> Self {
        if self.variant.matmul_weights == MatMulWeights::Packed {
            if let Some(pools) = pools {
                self.state_inputs
                    .push(names::PAST_CONFIDENCE_POOLS.to_string());
                self.confidence_pools = Some(pools);
            }
        }
        self
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
            split = ID_SPLIT,
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
    pub fn heads_doc(&self, confidence: bool, contrastive_dim: Option<usize>) -> String {
        let mut doc = String::new();
        if let Some(width) = contrastive_dim {
            doc.push_str(&format!(
                " Also {} float32 [{b}, {width}]: the contrastive head's unit-norm embedding of \
                 this call's real tokens (cosine similarity is the dot product).",
                names::CONTRASTIVE_EMBEDDING,
                b = dims::BATCH,
            ));
        }
        match (confidence, self.confidence_pools) {
            (false, _) => {}
            (true, None) => doc.push_str(&format!(
                " Also {} float32 [{b}]: the confidence head's logit over this call's real tokens.",
                names::CONFIDENCE_LOGIT,
                b = dims::BATCH,
            )),
            (true, Some(pools)) => doc.push_str(&format!(
                " Also {logit} float32 [{b}]: the confidence head's logit over every real token \
                 the row has fed, its running pools carried as {past} float32 [{b}, {pools}, \
                 d_model + 2] (zeros before the row's first token) → {present}.",
                logit = names::CONFIDENCE_LOGIT,
                past = names::PAST_CONFIDENCE_POOLS,
                present = names::PRESENT_CONFIDENCE_POOLS,
                b = dims::BATCH,
            )),
        }
        if contrastive_dim.is_some() || (confidence && self.confidence_pools.is_none()) {
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
        if let Some(pools) = self.confidence_pools {
            add(keys::CONFIDENCE_POOLS, pools.to_string());
        }
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
        // Accelerator graphs (`crate::accelerator`) leave out the stock-only keys: their
        // caller keeps the token history, and they have no `present.*` to share buffers with.
        let accelerator = get(keys::TARGET).is_some();
        if !accelerator && get(keys::TOKEN_HISTORY).is_none() {
            return Err(format!(
                "metadata key {} is missing: an export from before the token history moved \
                 into the KV cache; export it again",
                keys::TOKEN_HISTORY
            ));
        }
        let config = ModelConfig::from_metadata(read.spelled(keys::GENERATION)?, &get)?;
        let token_history_layer = match accelerator {
            true => config.num_layers(),
            false => read.parsed(keys::TOKEN_HISTORY)?,
        };
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
            past_present_share_buffer: !accelerator
                && read.parsed(keys::PAST_PRESENT_SHARE_BUFFER)?,
            state_inputs: read.names(keys::STATE_INPUTS)?,
            confidence_pools: get(keys::CONFIDENCE_POOLS)
                .map(|_| read.parsed(keys::CONFIDENCE_POOLS))
                .transpose()?,
            token_history_layer,
            padding_side: read.spelled(keys::PADDING_SIDE)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{MatMulWeights, Precision, Spelled};
    use crate::geometry::{CommonGeometry, EngramGeometry};
    use crate::needle2;

    fn description(attention: AttentionKind) -> ExportDescription {
        let config = needle2::Config {
            common: CommonGeometry {
                vocab: 11,
                d_model: 8,
                num_heads: 2,
                num_kv_heads: 1,
                num_layers: 3,
                max_seq_len: 32,
                hada_n: 8,
                mhc_lanes: 2,
                engram: EngramGeometry {
                    orders: vec![2, 3],
                    sites: vec![],
                    num_tables: 4,
                    slots: 5,
                    sub_dim: 2,
                    conv_taps: 2,
                    dilation: 3,
                    seed_stride: 2,
                },
                rope_theta: 1.0e4,
                kv_window: 0,
                kv_bits: 8,
            },
            head_dim: 4,
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
            c.common.kv_window = window;
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
            ExportDescription::from_metadata(|k| meta.get(k).filter(|_| k != key).cloned())
                .unwrap_err()
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
}
