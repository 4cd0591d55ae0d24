//! Where a model comes from (`--model`): a `.cact` exported in memory for the
//! provider, an `.onnx` from `needle-export` with its tokenizer beside it, or the
//! built-in demo model.

use crate::provider::{self, Provider, Unavailable};
use crate::session::NeedleSession;
use anyhow::{anyhow, bail, Context, Result};
use exporter::cact::CactFile;
use exporter::export::{export, keys, ExportOptions, Source};
use exporter::tokenizer::{NeedleTokenizer, SpecialIds};
use graphs::builder::{MatMulWeights, Precision};
use graphs::needle::AttentionKind;
use std::path::{Path, PathBuf};

/// The demo model shipped in the binary (`runner/demo/needle-demo.cact`).
pub const DEMO_CACT: &[u8] = include_bytes!("../demo/needle-demo.cact");
/// The demo model's tool list (`runner/demo/tools.json`).
pub const DEMO_TOOLS: &str = include_str!("../demo/tools.json");

/// A model to load.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// The built-in demo model.
    Demo,
    /// A `.cact` or an `.onnx` written by `needle-export`.
    Path(PathBuf),
}

/// How to load it.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub provider: Provider,
    /// Drop to CPU when the named provider cannot be registered.
    pub fallback: bool,
    /// Override the provider's preferred attention variant (`.cact` only).
    pub attention: Option<AttentionKind>,
    /// Override the provider's preferred precision (`.cact` only).
    pub precision: Option<Precision>,
    /// Dense (exact) or block-quantized MatMul weights (`.cact` only).
    pub matmul_weights: MatMulWeights,
    /// Intra-op threads; 0 lets onnxruntime choose.
    pub threads: usize,
    /// The tokenizer's whitespace rule (`.cact` only; an `.onnx` records its own).
    pub remove_extra_whitespaces: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            provider: Provider::Cpu,
            fallback: false,
            attention: None,
            precision: None,
            matmul_weights: MatMulWeights::Float,
            threads: 1,
            remove_extra_whitespaces: true,
        }
    }
}

/// A loaded model: the session, its tokenizer, and the providers skipped on the way.
pub struct LoadedModel {
    pub session: NeedleSession,
    pub tokenizer: NeedleTokenizer,
    pub skipped: Vec<Unavailable>,
}

/// Loads `source` on the provider `opts` asks for.
pub fn load(source: &ModelSource, opts: &LoadOptions) -> Result<LoadedModel> {
    let env = crate::ort_env::init()?;
    let registered = provider::session_builder(env, opts.provider, opts.fallback, opts.threads)?;
    let skipped = registered.skipped.clone();
    let chosen = registered.provider;
    let (session, tokenizer) = match source {
        ModelSource::Demo => from_cact("needle-demo.cact", DEMO_CACT, registered, opts)?,
        ModelSource::Path(path) if is_onnx(path) => from_onnx(path, registered, opts)?,
        ModelSource::Path(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            from_cact(&name, &bytes, registered, opts)
                .with_context(|| path.display().to_string())?
        }
    };
    debug_assert_eq!(session.provider, chosen);
    Ok(LoadedModel {
        session,
        tokenizer,
        skipped,
    })
}

fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

fn from_cact(
    name: &str,
    bytes: &[u8],
    registered: provider::Registered,
    opts: &LoadOptions,
) -> Result<(NeedleSession, NeedleTokenizer)> {
    let cact = CactFile::parse(bytes)?;
    let tokenizer = NeedleTokenizer::from_spec(cact.tokenizer(), opts.remove_extra_whitespaces)?;
    let export_opts = ExportOptions {
        matmul_weights: opts.matmul_weights,
        attention: opts.attention.unwrap_or(registered.provider.attention()),
        // fp32 on every provider: on CUDA (H200, onnxruntime 1.31.1) the fused fp16 graph
        // decoded the demo model at 12 tok/s against 204 for fused fp32, and the full-size
        // model at 48 against 42; `--precision fp16` remains available.
        precision: opts.precision.unwrap_or(Precision::Fp32),
        tokenizer_file: None,
        remove_extra_whitespaces: opts.remove_extra_whitespaces,
    };
    let onnx = export(&cact, &Source::of(name, bytes), &export_opts)?;
    Ok((NeedleSession::from_memory(&onnx, registered)?, tokenizer))
}

fn from_onnx(
    path: &Path,
    registered: provider::Registered,
    opts: &LoadOptions,
) -> Result<(NeedleSession, NeedleTokenizer)> {
    if !path.is_file() {
        bail!("{}: no such file", path.display());
    }
    let session = NeedleSession::from_file(path, registered)?;
    if opts.attention.is_some_and(|a| a != session.attention)
        || opts.precision.is_some_and(|p| p != session.precision)
    {
        bail!(
            "{}: --attention/--precision cannot change an exported graph; export it again with needle-export",
            path.display()
        );
    }
    let meta = &session.metadata;
    let flag = |k: &str| {
        meta.get(k)
            .map(|v| v == "true")
            .ok_or_else(|| anyhow!("{}: metadata {k} is missing", path.display()))
    };
    let id = |k: &str| -> Result<u32> {
        meta.get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{}: metadata {k} is missing", path.display()))
    };
    let special = SpecialIds {
        pad: id(keys::PAD_ID)?,
        eos: id(keys::EOS_ID)?,
        bos: id(keys::BOS_ID)?,
        unk: id(keys::UNK_ID)?,
    };
    let file = meta.get(keys::TOKENIZER).ok_or_else(|| {
        anyhow!(
            "{}: metadata {} is missing",
            path.display(),
            keys::TOKENIZER
        )
    })?;
    let tok_path = path.parent().unwrap_or(Path::new(".")).join(file);
    let json = std::fs::read_to_string(&tok_path).with_context(|| {
        format!(
            "{}: cannot read the tokenizer written beside the graph",
            tok_path.display()
        )
    })?;
    let tokenizer = NeedleTokenizer::from_json(
        &json,
        special,
        flag(keys::ADD_DUMMY_PREFIX)?,
        flag(keys::REMOVE_EXTRA_WHITESPACES)?,
    )
    .with_context(|| tok_path.display().to_string())?;
    Ok((session, tokenizer))
}
