//! `.cact` → ONNX model bytes: the pipeline shared by `needle-export` and the
//! runner's in-memory export.

use crate::cact::{CactError, CactFile};
use graphs::builder::{MatMulWeights, Precision};
use graphs::needle::{build, AttentionKind};
use prost::Message;
use sha2::{Digest, Sha256};

/// Metadata keys the exporter adds beside the geometry (`graphs::needle::config::keys`).
pub mod keys {
    pub const ATTENTION: &str = "needle.attention";
    pub const FUSED_OP: &str = "needle.fused_op";
    pub const PRECISION: &str = "needle.precision";
    pub const MATMUL_WEIGHTS: &str = "needle.matmul_weights";
    pub const SOURCE_FILE: &str = "needle.source_file";
    pub const SOURCE_SHA256: &str = "needle.source_sha256";
    pub const STATE_INPUTS: &str = "needle.state_inputs";
    pub const PAST_PRESENT_SHARE_BUFFER: &str = "needle.past_present_share_buffer";
    pub const TOKENIZER: &str = "needle.tokenizer";
    pub const ADD_DUMMY_PREFIX: &str = "needle.add_dummy_prefix";
    pub const REMOVE_EXTRA_WHITESPACES: &str = "needle.remove_extra_whitespaces";
    pub const PAD_ID: &str = "needle.pad_token_id";
    pub const EOS_ID: &str = "needle.eos_token_id";
    pub const BOS_ID: &str = "needle.bos_token_id";
    pub const UNK_ID: &str = "needle.unk_token_id";
}

/// What a caller asks of one export.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub attention: AttentionKind,
    pub precision: Precision,
    /// Dense (exact) or block-quantized weights for the large MatMuls.
    pub matmul_weights: MatMulWeights,
    /// File name of the tokenizer written beside the graph, recorded in metadata.
    pub tokenizer_file: Option<String>,
    /// The tokenizer's whitespace rule (sentencepiece `remove_extra_whitespaces`), recorded in metadata.
    pub remove_extra_whitespaces: bool,
}

/// Provenance of the source file, recorded in metadata.
#[derive(Clone, Debug)]
pub struct Source {
    pub file_name: String,
    pub sha256: String,
}

impl Source {
    /// Names the source and hashes its bytes.
    pub fn of(file_name: &str, bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let sha256 = digest.iter().map(|b| format!("{b:02x}")).collect();
        Source {
            file_name: file_name.to_string(),
            sha256,
        }
    }
}

/// The variant's name as recorded in metadata and accepted on the command line.
pub fn attention_name(kind: AttentionKind) -> &'static str {
    match kind {
        AttentionKind::Fused => "fused",
        AttentionKind::Reference => "reference",
    }
}

/// The precision's name as recorded in metadata and accepted on the command line.
pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Fp16 => "fp16",
    }
}

/// The MatMul weight storage's name as recorded in metadata and accepted on the command line.
pub fn matmul_weights_name(w: MatMulWeights) -> &'static str {
    match w {
        MatMulWeights::Float => "float",
        MatMulWeights::Int8 => "int8",
        MatMulWeights::Int4 => "int4",
    }
}

/// Dequantizes `cact` and serializes the graph of one variant.
pub fn export(
    cact: &CactFile,
    source: &Source,
    opts: &ExportOptions,
) -> Result<Vec<u8>, CactError> {
    let cfg = cact.config();
    let weights = cact.weights()?;
    let tok = cact.tokenizer();
    let mut meta = cfg.to_metadata();
    let mut add = |k: &str, v: String| meta.push((k.to_string(), v));
    add(keys::ATTENTION, attention_name(opts.attention).into());
    if opts.attention == AttentionKind::Fused {
        add(keys::FUSED_OP, "com.microsoft.GroupQueryAttention".into());
        add(
            keys::PAST_PRESENT_SHARE_BUFFER,
            "true: past_key_values.* may be buffers longer than past_sequence (the attention_mask \
             gives the length); bind the same buffer as present.* and attention writes only the \
             new positions, as onnxruntime-genai does"
                .into(),
        );
    }
    add(keys::PRECISION, precision_name(opts.precision).into());
    add(
        keys::MATMUL_WEIGHTS,
        matmul_weights_name(opts.matmul_weights).into(),
    );
    add(keys::SOURCE_FILE, source.file_name.clone());
    add(keys::SOURCE_SHA256, source.sha256.clone());
    add(
        keys::STATE_INPUTS,
        "past_input_ids: int64 [batch, past_sequence], the tokens seen so far (feed back present_input_ids); \
         the engram n-gram memory hashes the last conv_taps*dilation of them"
            .into(),
    );
    if let Some(t) = &opts.tokenizer_file {
        add(keys::TOKENIZER, t.clone());
    }
    add(keys::ADD_DUMMY_PREFIX, tok.add_dummy_prefix.to_string());
    add(
        keys::REMOVE_EXTRA_WHITESPACES,
        opts.remove_extra_whitespaces.to_string(),
    );
    add(keys::PAD_ID, tok.pad_id.to_string());
    add(keys::EOS_ID, tok.eos_id.to_string());
    add(keys::BOS_ID, tok.bos_id.to_string());
    add(keys::UNK_ID, tok.unk_id.to_string());
    let model = build(
        &cfg,
        &weights,
        opts.attention,
        opts.precision,
        opts.matmul_weights,
        meta,
    );
    Ok(model.encode_to_vec())
}
