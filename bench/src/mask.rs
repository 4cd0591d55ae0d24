//! `needle-bench --mask`: what `--constrain` costs a token. The constraint's mask over the
//! model's whole vocabulary under the demo tools, computed before each token of answers
//! that a seeded random walk over the allowed tokens writes (free reasoning, then JSON
//! calls, closed within a 96-token budget: no tokenizer-specific text needed), against a
//! one-token decode step of the same model (fused fp32) after a 64-token prefill, in one
//! run.

use crate::measure::{step, tokens};
use anyhow::{Context, Result};
use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant};
use runner::constrain::{CallCount, ConstraintFactory};
use runner::decode::{self, TokenFilter};
use runner::provider::{session_builder, Provider};
use runner::session::NeedleSession;
use std::path::Path;
use std::time::Instant;

/// Tokens each walked answer may take, and answers walked.
const BUDGET: usize = 96;
const ANSWERS: u64 = 4;

/// Timed decode steps.
const STEPS: usize = 16;

pub fn run(model: &Path, threads: usize) -> Result<String> {
    let bytes = std::fs::read(model).with_context(|| format!("cannot read {}", model.display()))?;
    let name = model.file_name().unwrap_or_default().to_string_lossy();
    let parsed =
        NeedleModel::from_bytes(&name, &bytes).with_context(|| model.display().to_string())?;
    let tokenizer = NeedleTokenizer::from_spec(&parsed.tokenizer, true)?;
    let tools: serde_json::Value = serde_json::from_str(runner::load::DEMO_TOOLS)?;

    let factory_start = Instant::now();
    let factory = ConstraintFactory::new(&tokenizer)?;
    let factory_secs = factory_start.elapsed().as_secs_f64();
    let vocab = parsed.config.output_vocab();
    let eos = tokenizer
        .token_id(exporter::tokenizer::IM_END)
        .context("the tokenizer has no <|im_end|>")?;
    let mut masks = Vec::new();
    let mut walked = 0;
    for seed in 0..ANSWERS {
        let mut constraint = factory.for_tools(&tools, CallCount::ANY, false, BUDGET)?;
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..BUDGET {
            let mut logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % 1000) as f32
                })
                .collect();
            let start = Instant::now();
            constraint.mask(&mut logits)?;
            masks.push(start.elapsed().as_secs_f64());
            let token = runner::decode::argmax(&logits);
            if token == eos {
                break;
            }
            constraint.accept(token)?;
            walked += 1;
        }
    }
    masks.sort_by(f64::total_cmp);
    let median = masks[masks.len() / 2];
    let worst = masks[masks.len() - 1];

    let onnx = parsed.export(&ExportOptions::in_memory(Variant {
        attention: AttentionKind::FUSED,
        precision: Precision::Fp32,
        matmul_weights: MatMulWeights::Float,
        runtime: RuntimeTarget::Since1_24,
    }));
    drop(parsed);
    let env = runner::ort_env::init()?;
    let mut session =
        NeedleSession::from_memory(&onnx, session_builder(env, Provider::Cpu, false, threads)?)?;
    let prompt = tokens(64, session.config().vocab(), 3);
    let mut out = decode::prefill(&mut session, &prompt, 64 + STEPS + 1)?;
    out = step(&mut session, out)?;
    let start = Instant::now();
    for _ in 0..STEPS {
        out = step(&mut session, out)?;
    }
    let decode = start.elapsed().as_secs_f64() / STEPS as f64;

    Ok(format!(
        "### `--constrain` per token: {}, {} pieces, {threads} thread(s)\n\n\
         | metric | value |\n|---|---:|\n\
         | grammar compiler setup (once per process), ms | {:.1} |\n\
         | mask per token, median of {} ({} walked answers, {} tokens), ms | {:.3} |\n\
         | mask per token, worst, ms | {:.3} |\n\
         | decode step after 64 tokens, ms | {:.2} |\n\
         | median mask ÷ decode step | {:.1}% |\n",
        model.display(),
        tokenizer.vocab_size(),
        factory_secs * 1e3,
        masks.len(),
        ANSWERS,
        walked,
        median * 1e3,
        worst * 1e3,
        decode * 1e3,
        100.0 * median / decode
    ))
}
