//! Where a model comes from (`--model`): a `.cact` exported in memory for the
//! provider, an `.onnx` from `needle-export` with its tokenizer beside it, or the
//! built-in demo model.

use crate::graph_cache;
use crate::plan::{graphs_for, GraphKind, Overrides, PlannedGraphs};
use crate::provider::{self, Provider, Unavailable};
use crate::session::NeedleSession;
use anyhow::{anyhow, bail, Context, Result};
use exporter::export::ExportOptions;
use exporter::model::{file_name, sha256_hex, NeedleModel};
use exporter::output::{data_file, ExportFiles};
use exporter::tokenizer::{NeedleTokenizer, SpecialIds};
use graphs::accelerator::PREFILL_CHUNK;
use graphs::contract::{keys, AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant};
use graphs::encoding::check_external;
use graphs::onnx::ModelProto;
use prost::Message;
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
    /// Override the provider's choice of stock or accelerator graphs (`.cact` only).
    pub graph: Option<GraphKind>,
    /// Override the provider's preferred attention variant (`.cact` only).
    pub attention: Option<AttentionKind>,
    /// Override the provider's preferred precision (`.cact` only).
    pub precision: Option<Precision>,
    /// Override the provider's preferred MatMul weights (`.cact` only).
    pub matmul_weights: Option<MatMulWeights>,
    /// Intra-op threads; 0 lets onnxruntime choose.
    pub threads: usize,
    /// The tokenizer's whitespace rule (`.cact` only; an `.onnx` records its own).
    pub remove_extra_whitespaces: bool,
    /// Run this ladder rung of a Needle 3 `.cact` (an `.onnx` is the rung it was exported as).
    pub layers: Option<usize>,
    /// Keep the graphs exported from `.cact` files in this folder and load them from there
    /// next time ([`crate::graph_cache`]); `None` exports in memory every time.
    pub cache: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            provider: Provider::Cpu,
            fallback: false,
            graph: None,
            attention: None,
            precision: None,
            matmul_weights: None,
            threads: 1,
            remove_extra_whitespaces: true,
            layers: None,
            cache: None,
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
        ModelSource::Demo => {
            let demo = NeedleModel::from_bytes("needle-demo.cact", DEMO_CACT)?;
            from_cact(demo, registered, opts).context("the built-in demo model")?
        }
        ModelSource::Path(path) if is_onnx(path) => from_onnx(path, registered, opts)?,
        ModelSource::Path(path) => match &opts.cache {
            Some(dir) => through_cache(path, dir, registered, opts)?,
            None => from_cact(NeedleModel::read(path)?, registered, opts)
                .with_context(|| path.display().to_string())?,
        },
    };
    debug_assert_eq!(session.provider(), chosen);
    Ok(LoadedModel {
        session,
        tokenizer,
        skipped,
    })
}

/// Whether `path` names an exported graph (`.onnx`) rather than a `.cact`.
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// The `.cact` at `path` through the graph cache in `dir`: its cached graph when there is
/// a usable one, else exported into the cache and loaded from there; exported in memory
/// when the cache cannot be written (said on stderr).
fn through_cache(
    path: &Path,
    dir: &Path,
    registered: provider::Registered,
    opts: &LoadOptions,
) -> Result<(NeedleSession, NeedleTokenizer)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let planned = planned_graphs(&registered, opts)?;
    let graph = graph_cache::graph_path(
        dir,
        &sha256_hex(&bytes),
        planned,
        opts.layers,
        opts.remove_extra_whitespaces,
    );
    // The cached graph is already the rung.
    let cached_opts = LoadOptions {
        layers: None,
        ..opts.clone()
    };
    if graph.is_file() {
        match from_onnx(&graph, registered.clone(), &cached_opts) {
            Ok(loaded) => return Ok(loaded),
            Err(e) => {
                eprintln!("needle-run: the cached graph is unusable ({e:#}); exporting again")
            }
        }
    }
    let (model, tokenizer) = prepared(NeedleModel::from_file_bytes(path, &bytes)?, opts)?;
    let written = std::fs::create_dir_all(dir)
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            let (files, variant) = match planned {
                // Weights beside the graph, which onnxruntime memory-maps instead of copying
                // them out of the graph's bytes (the full-size Needle 2 fp32: 77 MiB less
                // peak RSS, 0.14 s less to the first token).
                PlannedGraphs::Stock(variant) => (
                    ExportFiles::beside(&graph, &[variant.attention]).with_external_data(),
                    variant,
                ),
                PlannedGraphs::Accelerator(target) => (
                    ExportFiles::accelerator(&graph, target),
                    accelerator_variant(),
                ),
            };
            files.write(
                &model,
                &tokenizer,
                variant.precision,
                variant.matmul_weights,
                variant.runtime,
            )
        });
    match written {
        Ok(_) => from_onnx(&graph, registered, &cached_opts),
        Err(e) => {
            eprintln!(
                "needle-run: cannot cache the exported graph in {} ({e:#}); exporting in memory",
                dir.display()
            );
            in_memory(&model, tokenizer, planned, registered, opts)
        }
    }
    .with_context(|| path.display().to_string())
}

/// Where a data file lies beside the graph (`needle-export --external-data`), that it holds
/// what the graph's initializers say they keep there. The graph is small then (its large
/// initializers are in the data file), so reading it first costs little.
fn check_data_file(path: &Path) -> Result<()> {
    let data = data_file(path);
    let Ok(meta) = std::fs::metadata(&data) else {
        return Ok(());
    };
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let Ok(model) = ModelProto::decode(&bytes[..]) else {
        return Ok(()); // not a graph at all: onnxruntime says so
    };
    check_external(&model, &file_name(&data), meta.len())
        .map_err(|e| anyhow!("{}: {e}", data.display()))
}

/// Exports `model` in memory as the variant the plan picks for the registered provider.
fn from_cact(
    model: NeedleModel,
    registered: provider::Registered,
    opts: &LoadOptions,
) -> Result<(NeedleSession, NeedleTokenizer)> {
    let planned = planned_graphs(&registered, opts)?;
    let (model, tokenizer) = prepared(model, opts)?;
    in_memory(&model, tokenizer, planned, registered, opts)
}

/// The graphs the plan picks for the registered provider and the options.
fn planned_graphs(registered: &provider::Registered, opts: &LoadOptions) -> Result<PlannedGraphs> {
    let overrides = Overrides {
        graph: opts.graph,
        attention: opts.attention,
        precision: opts.precision,
        matmul_weights: opts.matmul_weights,
    };
    graphs_for(registered.provider, overrides).map_err(anyhow::Error::msg)
}

/// The one variant the accelerator graphs are exported as (`graphs::accelerator::check`).
fn accelerator_variant() -> Variant {
    Variant {
        attention: AttentionKind::Reference,
        precision: Precision::Fp32,
        matmul_weights: MatMulWeights::Float,
        runtime: RuntimeTarget::Since1_24,
    }
}

/// The rung `opts` asks for (the whole model without `--layers`) and its tokenizer.
fn prepared(model: NeedleModel, opts: &LoadOptions) -> Result<(NeedleModel, NeedleTokenizer)> {
    let model = match opts.layers {
        Some(depth) => model.rung(depth).map_err(anyhow::Error::msg)?,
        None => model,
    };
    let tokenizer = NeedleTokenizer::from_spec(&model.tokenizer, opts.remove_extra_whitespaces)?;
    Ok((model, tokenizer))
}

/// A session of `model` exported in memory as `planned`.
fn in_memory(
    model: &NeedleModel,
    tokenizer: NeedleTokenizer,
    planned: PlannedGraphs,
    registered: provider::Registered,
    opts: &LoadOptions,
) -> Result<(NeedleSession, NeedleTokenizer)> {
    let options = |variant| ExportOptions {
        variant,
        tokenizer_file: None,
        remove_extra_whitespaces: opts.remove_extra_whitespaces,
    };
    let session = match planned {
        PlannedGraphs::Stock(variant) => {
            NeedleSession::from_memory(&model.export(&options(variant)), registered)?
        }
        PlannedGraphs::Accelerator(target) => {
            let opts = options(accelerator_variant());
            let graph = |sequence| {
                model
                    .export_accelerator(&opts, target, sequence)
                    .map_err(anyhow::Error::msg)
            };
            NeedleSession::accelerator_from_memory(&graph(1)?, &graph(PREFILL_CHUNK)?, registered)?
        }
    };
    Ok((session, tokenizer))
}

fn from_onnx(
    path: &Path,
    registered: provider::Registered,
    opts: &LoadOptions,
) -> Result<(NeedleSession, NeedleTokenizer)> {
    if !path.is_file() {
        bail!("{}: no such file", path.display());
    }
    check_data_file(path)?;
    let session = NeedleSession::from_file(path, registered)?;
    let variant = session.description.variant;
    if opts.layers.is_some() {
        bail!(
            "{}: --layers picks a rung of a .cact; an exported graph is the rung it was \
             exported as (needle-export --layers N)",
            path.display()
        );
    }
    if variant.runtime != RuntimeTarget::Since1_24
        && session.description.window_depends_on_release()
    {
        bail!(
            "{}: written for onnxruntime 1.20 to 1.23 (--onnxruntime {}), whose sliding window \
             the onnxruntime needle-run links (1.24 or later) makes one key narrower; export it \
             again without --onnxruntime",
            path.display(),
            variant.runtime
        );
    }
    let kind = match session.is_accelerator() {
        true => GraphKind::Accelerator,
        false => GraphKind::Stock,
    };
    if opts.graph.is_some_and(|g| g != kind) {
        bail!(
            "{}: --graph cannot change an exported graph; export it again with needle-export \
             (--target for the accelerator graphs)",
            path.display()
        );
    }
    if opts.attention.is_some_and(|a| a != variant.attention)
        || opts.precision.is_some_and(|p| p != variant.precision)
    {
        bail!(
            "{}: --attention/--precision cannot change an exported graph; export it again with needle-export",
            path.display()
        );
    }
    let t = &session.description.tokenizer;
    let special = SpecialIds {
        pad: t.pad_id,
        eos: t.eos_id,
        bos: t.bos_id,
        unk: t.unk_id,
    };
    let file = t.file.as_ref().ok_or_else(|| {
        anyhow!(
            "{}: metadata {} is missing",
            path.display(),
            keys::TOKENIZER
        )
    })?;
    let tok_path = path.parent().unwrap_or(Path::new(".")).join(&file.name);
    let json = std::fs::read_to_string(&tok_path).with_context(|| {
        format!(
            "{}: cannot read the tokenizer written beside the graph",
            tok_path.display()
        )
    })?;
    let tokenizer = NeedleTokenizer::from_json(
        &json,
        special,
        t.add_dummy_prefix,
        t.remove_extra_whitespaces,
    )
    .with_context(|| tok_path.display().to_string())?;
    check_belongs_together(path, &session, &tok_path, &tokenizer)?;
    if let Some(recorded) = &file.sha256 {
        if sha256_hex(json.as_bytes()) != *recorded {
            bail!(
                "{}: is not the tokenizer {} was exported with (its SHA-256 differs from the \
                 graph's {}); export the model again or put its own tokenizer beside it",
                tok_path.display(),
                path.display(),
                keys::TOKENIZER_SHA256
            );
        }
    }
    Ok((session, tokenizer))
}

/// The tokenizer beside a graph must fit it: the graph's vocabulary size and room for its
/// special ids. A tokenizer of another model would otherwise run and decode ids as "�".
fn check_belongs_together(
    graph: &Path,
    session: &NeedleSession,
    tok_path: &Path,
    tokenizer: &NeedleTokenizer,
) -> Result<()> {
    let d = &session.description;
    let (graph, tok) = (graph.display(), tok_path.display());
    let vocab = d.config.vocab();
    // A model may embed more ids than its tokenizer has pieces (the full-size random
    // bench models do), never fewer.
    let pieces = tokenizer.vocab_size();
    if pieces > vocab {
        bail!("{tok}: has {pieces} pieces, more than the {vocab} ids {graph} embeds");
    }
    let t = &d.tokenizer;
    let special = [
        ("pad", t.pad_id),
        ("eos", t.eos_id),
        ("bos", t.bos_id),
        ("unk", t.unk_id),
    ];
    if let Some((name, id)) = special.iter().find(|(_, id)| *id as usize >= pieces) {
        bail!("{graph}: metadata {name} id {id} is not one of the {pieces} pieces of {tok}");
    }
    Ok(())
}
