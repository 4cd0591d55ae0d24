//! The cost of the opt-in block-quantized MatMul weights (`--weights int8|int4`):
//! teacher-forced greedy-token agreement with the exact model on the demo's held-out
//! set (the exact model's own greedy answers), and the logit error on upstream case D.

use exporter::cact::Needle2File;
use graphs::contract::AttentionKind;
use graphs::contract::{MatMulWeights, Precision};
use needle_tests::{cases, fixture, options, repo_root, row_error, session_of};
use runner::decode::{argmax, GenerateOptions, Sampling};
use runner::generate::generate;
use runner::prompt::render_prompt;
use runner::provider::Provider;
use runner::session::NeedleSession;
use runner::tokenizer::NeedleTokenizer;
use serde_json::Value;

fn session(bytes: &[u8], weights: MatMulWeights) -> NeedleSession {
    session_of(
        bytes,
        &options(AttentionKind::FUSED, Precision::Fp32, weights),
        Provider::Cpu,
    )
}

/// Fraction of the exact model's greedy tokens that `weights` also picks, given the same prefix.
fn agreement(weights: MatMulWeights) -> (usize, usize) {
    let bytes = std::fs::read(repo_root().join("runner/demo/needle-demo.cact")).unwrap();
    let tok =
        NeedleTokenizer::from_spec(Needle2File::parse(&bytes).unwrap().tokenizer(), true).unwrap();
    let mut exact = session(&bytes, MatMulWeights::Float);
    let mut compact = session(&bytes, weights);
    let vocab = exact.config().output_vocab();
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    let (mut same, mut total) = (0, 0);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let ex: Value = serde_json::from_str(line).unwrap();
        let prompt = render_prompt(&ex["tools"], ex["query"].as_str().unwrap(), None);
        let ids = [vec![tok.bos_id()], tok.encode(&prompt)].concat();
        let stop = vec![tok.eos_id(), tok.token_id("<|im_end|>").unwrap()];
        let opts = GenerateOptions {
            max_new_tokens: 128,
            stop_ids: stop,
            sampling: Sampling::Greedy,
        };
        let run = generate(&mut exact, &ids, &opts).unwrap();
        let mut want = run.generated_ids.clone();
        want.extend(run.stopped_on);
        let all: Vec<i64> = ids.iter().chain(&want).map(|&t| t as i64).collect();
        let logits = compact
            .forward(&all, 1, compact.empty_cache(1).unwrap())
            .unwrap()
            .logits;
        for (i, &t) in want.iter().enumerate() {
            let pos = ids.len() - 1 + i;
            total += 1;
            same += (argmax(&logits[pos * vocab..(pos + 1) * vocab]) == t) as usize;
        }
    }
    (same, total)
}

fn logit_error(weights: MatMulWeights) -> f32 {
    let bytes = std::fs::read(fixture("m64.cact")).unwrap();
    let mut s = session(&bytes, weights);
    let case = cases("m64").into_iter().find(|c| c.name == "D").unwrap();
    let got = s
        .forward(&case.input_ids, 1, s.empty_cache(1).unwrap())
        .unwrap()
        .logits;
    row_error(&got, &case.logits, case.seq, s.config().output_vocab())
}

#[test]
fn int8_weights_keep_99_percent_of_greedy_tokens() {
    let (same, total) = agreement(MatMulWeights::Int8);
    println!(
        "int8: greedy-token agreement {same}/{total}, m64 case D relative logit error {:.2e}",
        logit_error(MatMulWeights::Int8)
    );
    assert!(same * 100 >= total * 99, "int8 agreement {same}/{total}");
}

#[test]
fn int4_weights_keep_99_percent_of_greedy_tokens() {
    let (same, total) = agreement(MatMulWeights::Int4);
    println!(
        "int4: greedy-token agreement {same}/{total}, m64 case D relative logit error {:.2e}",
        logit_error(MatMulWeights::Int4)
    );
    assert!(same * 100 >= total * 99, "int4 agreement {same}/{total}");
}
