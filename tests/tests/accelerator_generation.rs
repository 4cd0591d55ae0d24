//! The accelerator graphs (`needle-export --target`) through the runner's session driver on
//! the CPU EP: upstream's logits on every fixture of both generations, each row whole
//! through the prefill graph and its prefix there then 40 decode steps (fewer for short
//! rows); upstream's greedy
//! generations token for token on every fixture with them (prompts of 82–187 tokens, so
//! two or three 64-token prefill chunks, then 32 tokens or EOS); and the demo model's
//! answers to held-out queries the same as the stock graph's.

use needle_tests::{
    accelerator_session_of, cases, fixture, fixture_generate_options, generations, repo_root,
    row_error, GENERATING_MODELS, MODELS,
};
use runner::answer::Runner;
use runner::generate::generate;
use runner::load::{LoadOptions, ModelSource};
use runner::plan::GraphKind;
use serde_json::Value;

/// The bound `exporter/tests/accelerator.rs` holds these graphs to (the contract's
/// relative rule), and the decode steps each row ends with.
const BOUND: f32 = 1e-5;
const DECODE_STEPS: usize = 40;

#[test]
fn cached_decode_through_the_accelerator_graphs_matches_upstream_logits() {
    for model in MODELS {
        let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
        let mut s = accelerator_session_of(&bytes);
        let vocab = s.config().output_vocab();
        let (mut most_steps, mut longest_prefix) = (0, 0);
        for case in cases(model) {
            for (b, &len) in case.lengths.iter().enumerate() {
                let row = &case.input_ids[b * case.seq..][..len];
                let reference = &case.logits[b * case.seq * vocab..][..case.seq * vocab];
                // Whole through the prefill graph, then its last tokens decoded one a call.
                for steps in [0, DECODE_STEPS.min(len - 1)] {
                    let (prefix, rest) = row.split_at(len - steps);
                    let mut out = s.forward(prefix, 1, s.empty_cache(1).unwrap()).unwrap();
                    let mut got = std::mem::take(&mut out.logits);
                    for &token in rest {
                        out = s.forward(&[token], 1, out.cache).unwrap();
                        got.extend_from_slice(&out.logits);
                    }
                    let error = row_error(&got, reference, len, vocab);
                    let what = format!("{model} {}[{b}], {steps} steps", case.name);
                    assert!(error <= BOUND, "{what}: {error}");
                    most_steps = most_steps.max(steps);
                    longest_prefix = longest_prefix.max(prefix.len());
                }
            }
        }
        assert!(most_steps >= 32, "{model}: {most_steps} decode steps");
        assert!(longest_prefix > 64, "{model}: one prefill chunk only");
    }
}

#[test]
fn greedy_generation_through_the_accelerator_graphs_matches_upstream() {
    let mut decoded = 0;
    for model in GENERATING_MODELS {
        let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
        let mut s = accelerator_session_of(&bytes);
        assert!(s.is_accelerator());
        for r in generations(model) {
            assert!(r.prompt_ids.len() > 64, "{model}: one prefill chunk only");
            let got = generate(&mut s, &r.prompt_ids, &fixture_generate_options()).unwrap();
            assert_eq!(got.generated_ids, r.generated_ids, "{model}");
            assert_eq!(got.stopped_on.is_some(), r.stopped_on_eos, "{model}");
            decoded = decoded.max(got.decode_tokens);
        }
    }
    // 32 tokens: the prefill's, then 31 decode steps.
    assert!(decoded >= 31, "{decoded} decode steps at most");
}

/// The demo's first held-out queries (`runner/demo/eval.jsonl`).
const DEMO_QUERIES: usize = 6;

#[test]
fn the_demo_answers_held_out_queries_as_the_stock_graph_does() {
    let options = |graph| LoadOptions {
        graph: Some(graph),
        ..LoadOptions::default()
    };
    let mut stock = Runner::new(&ModelSource::Demo, &options(GraphKind::Stock)).unwrap();
    let mut accelerated =
        Runner::new(&ModelSource::Demo, &options(GraphKind::Accelerator)).unwrap();
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    for line in text.lines().take(DEMO_QUERIES) {
        let ex: Value = serde_json::from_str(line).unwrap();
        let query = ex["query"].as_str().unwrap();
        let want = stock.complete(&ex["tools"], query, None, 128).unwrap();
        let got = accelerated
            .complete(&ex["tools"], query, None, 128)
            .unwrap();
        assert_eq!(got.function_calls, want.function_calls, "{query}");
        assert_eq!(got.reasoning, want.reasoning, "{query}");
        assert_eq!(got.text, want.text, "{query}");
        assert_eq!(got.generated_tokens, want.generated_tokens, "{query}");
        assert_eq!(
            got.confidence, None,
            "the accelerator graphs have no probe heads"
        );
    }
}
