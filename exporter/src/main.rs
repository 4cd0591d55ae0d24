//! `needle-export MODEL.cact OUT.onnx [--attention fused|reference|both] [--precision fp32|fp16]`

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use exporter::cact::CactFile;
use exporter::cli::{PrecisionArg, WeightsArg};
use exporter::export::{export, ExportOptions, Source};
use exporter::output::write_atomically;
use graphs::needle::AttentionKind;
use std::io::{stdout, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Converts a Needle 2 `.cact` model into ONNX graphs for onnxruntime.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The Needle 2 `.cact` file.
    model: PathBuf,
    /// The graph to write; `--attention both` also writes `OUT.reference.onnx`.
    out: PathBuf,
    /// Attention core: onnxruntime's fused kernel, a plain ai.onnx subgraph, or both files.
    #[arg(long, value_enum, default_value = "fused")]
    attention: AttentionArg,
    /// Float precision of weights and activations (logits stay float32).
    #[arg(long, value_enum, default_value = "fp32")]
    precision: PrecisionArg,
    /// Weights of the large MatMuls: `float` is the exact model; `int8`/`int4`
    /// re-quantize them into `com.microsoft.MatMulNBits` blocks (smaller, faster, approximate).
    #[arg(long, value_enum, default_value = "float")]
    weights: WeightsArg,
    /// SentencePiece's `remove_extra_whitespaces` for the tokenizer (the `.cact` does not
    /// record it; sentencepiece's default is true): drop leading, trailing and repeated spaces.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    remove_extra_whitespaces: bool,
    /// Replace existing output files.
    #[arg(long)]
    force: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum AttentionArg {
    Fused,
    Reference,
    Both,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("needle-export: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let precision = args.precision.into();
    let targets: Vec<(AttentionKind, PathBuf)> = match args.attention {
        AttentionArg::Fused => vec![(AttentionKind::Fused, args.out.clone())],
        AttentionArg::Reference => vec![(AttentionKind::Reference, args.out.clone())],
        AttentionArg::Both => vec![
            (AttentionKind::Fused, args.out.clone()),
            (
                AttentionKind::Reference,
                args.out.with_extension("reference.onnx"),
            ),
        ],
    };
    let tokenizer_path = args.out.with_extension("tokenizer.json");
    for path in targets.iter().map(|(_, p)| p).chain([&tokenizer_path]) {
        check_destination(&args.model, path, args.force)?;
    }

    let bytes = std::fs::read(&args.model)
        .with_context(|| format!("cannot read {}", args.model.display()))?;
    let cact = CactFile::parse(&bytes).with_context(|| format!("{}", args.model.display()))?;
    let source = Source::of(&file_name(&args.model), &bytes);
    let tokenizer = exporter::tokenizer::NeedleTokenizer::from_spec(
        cact.tokenizer(),
        args.remove_extra_whitespaces,
    )
    .with_context(|| format!("{}: tokenizer", args.model.display()))?;
    let tokenizer_file = file_name(&tokenizer_path);
    for (kind, path) in &targets {
        let opts = ExportOptions {
            matmul_weights: args.weights.into(),
            attention: *kind,
            precision,
            tokenizer_file: Some(tokenizer_file.clone()),
            remove_extra_whitespaces: args.remove_extra_whitespaces,
        };
        let onnx =
            export(&cact, &source, &opts).with_context(|| format!("{}", args.model.display()))?;
        write_atomically(path, &onnx)
            .with_context(|| format!("{}: cannot write", path.display()))?;
        writeln!(stdout(), "wrote {} ({} bytes)", path.display(), onnx.len())?;
    }
    write_atomically(&tokenizer_path, tokenizer.to_json().as_bytes())
        .with_context(|| format!("{}: cannot write", tokenizer_path.display()))?;
    writeln!(stdout(), "wrote {}", tokenizer_path.display())?;
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Refuses to write over the input, and over an existing file without `--force`.
fn check_destination(input: &Path, out: &Path, force: bool) -> Result<()> {
    if let (Ok(a), Ok(b)) = (input.canonicalize(), out.canonicalize()) {
        if a == b {
            bail!("{}: refusing to write over the input model", out.display());
        }
    }
    if out.exists() && !force {
        bail!(
            "{}: already exists (use --force to replace it)",
            out.display()
        );
    }
    Ok(())
}
