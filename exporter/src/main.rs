//! `needle-export MODEL.cact OUT.onnx [--attention fused|reference|both] [--precision fp32|fp16]`

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use exporter::cli::spelled;
use exporter::model::NeedleModel;
use exporter::output::{interrupt, ExportFiles};
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{
    parse_spelled, AcceleratorTarget, AttentionKind, Generation, MatMulWeights, Precision,
    RuntimeTarget, Spelled,
};
use std::io::{stdout, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Converts a Needle 2 or Needle 3 `.cact` model into ONNX graphs for onnxruntime.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The `.cact` file (Needle 2 or 3; the file says which).
    model: PathBuf,
    /// The graph to write; `--attention both` also writes `OUT.reference.onnx`. With
    /// `--genai`, the folder to write.
    out: PathBuf,
    /// Attention core: onnxruntime's fused kernel (the default), a plain ai.onnx subgraph,
    /// or both files.
    #[arg(long, value_parser = attention_targets())]
    attention: Option<Targets>,
    /// Float precision of weights and activations (logits stay float32).
    #[arg(long, value_parser = spelled::<Precision>(), default_value_t = Precision::Fp32)]
    precision: Precision,
    /// Weights of the large MatMuls: `float` is the exact model; `cq` the exact model as the
    /// `.cact`'s codes, decoded by ops onnxruntime folds at session creation (about the
    /// `.cact`'s size, slower to load); `packed` the exact model as the codes, multiplied by
    /// the Needle kernels (`needle.CqMatMul`: needle-run, or onnxruntime with the kernels
    /// library; float32 only); `int8`/`int4` re-quantize them into
    /// `com.microsoft.MatMulNBits` blocks (smaller, faster, approximate).
    #[arg(long, value_parser = spelled::<MatMulWeights>(), default_value_t = MatMulWeights::Float)]
    weights: MatMulWeights,
    /// The onnxruntime releases the fused graph is for, by the oldest: 1.24 (1.24 and later:
    /// opset-23 kernels) or 1.20 (1.20 to 1.23: IR 10, opset 21, their attention window).
    #[arg(long, value_parser = spelled::<RuntimeTarget>(), default_value_t = RuntimeTarget::Since1_24)]
    onnxruntime: RuntimeTarget,
    /// SentencePiece's `remove_extra_whitespaces` for the tokenizer (the `.cact` does not
    /// record it; sentencepiece's default is true): drop leading, trailing and repeated spaces.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    remove_extra_whitespaces: bool,
    /// Write an onnxruntime-genai folder OUT: model.onnx, genai_config.json,
    /// tokenizer.json, tokenizer_config.json (one attention variant).
    #[arg(long)]
    genai: bool,
    /// Write the static-shape graphs for an accelerator's execution provider instead:
    /// `OUT.onnx` takes one token a call (decode), `OUT.prefill.onnx` a chunk; fixed
    /// batch and cache capacity, ops CoreML and NNAPI take (float weights; fp16 for coreml
    /// and tensorrt, nnapi's through its EP option; not with --attention, --genai,
    /// --onnxruntime).
    #[arg(long, value_parser = spelled::<AcceleratorTarget>())]
    target: Option<AcceleratorTarget>,
    /// Export the N-layer ladder rung of a Needle 3 model (2 to its depth), its blocks
    /// chosen as upstream chooses them.
    #[arg(long)]
    layers: Option<usize>,
    /// Put each graph's large initializers (64 KiB or more) into `OUT.onnx.data` beside it
    /// (ONNX external data, each at a 64 KiB-aligned offset, which onnxruntime memory-maps on
    /// the CPU instead of holding a copy); the two files go together. Not with --target.
    #[arg(long)]
    external_data: bool,
    /// Replace existing output files.
    #[arg(long)]
    force: bool,
}

/// `--attention`: one variant into `OUT.onnx`, or `both` (the reference one into
/// `OUT.reference.onnx`).
#[derive(Clone, Copy)]
enum Targets {
    One(AttentionKind),
    Both,
}

const BOTH: &str = "both";

impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Targets::One(kind) => kind.fmt(f),
            Targets::Both => f.write_str(BOTH),
        }
    }
}

fn attention_targets() -> impl TypedValueParser<Value = Targets> {
    let names = AttentionKind::ALL.iter().map(|k| k.name()).chain([BOTH]);
    PossibleValuesParser::new(names).map(|name| match name.as_str() {
        BOTH => Targets::Both,
        one => Targets::One(parse_spelled(one).expect("clap checked the name")),
    })
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
    interrupt::remove_temporaries_on_signal().context("cannot watch for SIGINT/SIGTERM")?;
    let attentions = match args.attention.unwrap_or(Targets::One(AttentionKind::FUSED)) {
        Targets::One(kind) => vec![kind],
        Targets::Both => vec![AttentionKind::FUSED, AttentionKind::Reference],
    };
    let files = match (args.target, args.genai, attentions.as_slice()) {
        (Some(target), false, _) => {
            if args.attention.is_some() || args.onnxruntime != RuntimeTarget::Since1_24 {
                bail!("--target writes its own graphs: leave out --attention and --onnxruntime");
            }
            ExportFiles::accelerator(&args.out, target)
        }
        (Some(_), true, _) => bail!("--target and --genai write different exports: choose one"),
        (None, false, _) => ExportFiles::beside(&args.out, &attentions),
        (None, true, [attention]) => ExportFiles::genai_folder(&args.out, *attention),
        (None, true, _) => {
            bail!("--genai writes one graph: choose --attention fused or reference")
        }
    };
    if args.external_data && args.target.is_some() {
        bail!("--target's graphs keep their weights inside them: leave out --external-data");
    }
    let files = match args.external_data {
        true => files.with_external_data(),
        false => files,
    };
    if args.genai && args.onnxruntime != RuntimeTarget::Since1_24 {
        bail!(
            "--genai writes folders for onnxruntime-genai 0.18, which runs onnxruntime 1.24 or \
             later: leave out --onnxruntime {}",
            args.onnxruntime
        );
    }
    if args.weights == MatMulWeights::Packed && args.precision != Precision::Fp32 {
        bail!(
            "--weights packed multiplies float32 activations: leave out --precision {}",
            args.precision
        );
    }
    if args.weights == MatMulWeights::Packed && args.genai {
        bail!("--genai folders run on stock onnxruntime-genai, which lacks the Needle kernels: leave out --weights packed");
    }
    files.check(&args.model, args.force)?;
    let mut model = NeedleModel::read(&args.model)?;
    if let Some(depth) = args.layers {
        model = model
            .rung(depth)
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.model.display()))?;
    }
    if args.genai && model.generation() != Generation::Needle2 {
        bail!(
            "{}: --genai writes onnxruntime-genai folders for Needle 2 models only; this is a \
             Needle 3 file (its per-layer QKV-conv state has no genai form yet)",
            args.model.display()
        );
    }
    if model.skipped_audio_tensors > 0 {
        eprintln!(
            "needle-export: note: {} carries a Whistle audio section ({} tensors); audio is not \
             supported, so the graphs are text-only",
            args.model.display(),
            model.skipped_audio_tensors
        );
    }
    let tokenizer = NeedleTokenizer::from_spec(&model.tokenizer, args.remove_extra_whitespaces)
        .with_context(|| format!("{}: tokenizer", args.model.display()))?;
    let written = files.write(
        &model,
        &tokenizer,
        args.precision,
        args.weights,
        args.onnxruntime,
    )?;
    for (path, bytes) in written {
        writeln!(stdout(), "wrote {} ({bytes} bytes)", path.display())?;
    }
    Ok(())
}
