//! Continuous batching (`runner::engine`, what `needle-run serve` and `needle-run --batch`
//! decode with): rows decoded together give each row its single run.
//!
//! - The engine: rows that join a running batch at step boundaries and leave it when done
//!   see, at every step, the logits of their single run (which matches upstream,
//!   `conformance.rs`), and generate its tokens; every conformance model, both attention
//!   variants (the fused one with its in-place cache), rows of different lengths and
//!   budgets, newcomers prefilled in one call or one by one.
//! - Its answers: `Runner::complete_batch` (`needle-run --batch`): queries decoded together
//!   through the batch-exact graph give each query's one-at-a-time answer, free and
//!   constrained, on the demo model's held-out set (16 rows at a time, the next query
//!   joining as a row is done; prompts of different lengths, answers that end at different
//!   steps).
//!
//! - A lone newcomer whose prompt continues one the engine prefilled before (a
//!   conversation coming back to the server) prefilled after that prompt's cache: its
//!   single run's logits, every conformance model, both attention variants.
//!
//! That padded rows in one graph call are their single runs is `padded_batch.rs`.

use graphs::contract::AttentionKind;
use needle_tests::{repo_root, row_error, session, MODELS};
use runner::answer::{Runner, ToolQuery, ToolResponse};
use runner::decode::{GenerateOptions, Sampling, TokenFilter};
use runner::engine::{Admission, Engine, RowId};
use runner::generate::generate_filtered;
use runner::load::{LoadOptions, ModelSource};
use serde_json::Value;
use std::cell::RefCell;
use std::rc::Rc;

const BOUND: f32 = 1e-5;

/// Keeps a copy of the logits of every step it is asked to mask.
#[derive(Clone, Default)]
struct Recorder(Rc<RefCell<Vec<Vec<f32>>>>);

impl TokenFilter for Recorder {
    fn mask(&mut self, logits: &mut [f32]) -> anyhow::Result<()> {
        self.0.borrow_mut().push(logits.to_vec());
        Ok(())
    }

    fn accept(&mut self, _token: u32) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Deterministic prompt `r` of `len` tokens (ids above the special ones).
fn prompt(r: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| (4 + (i * 37 + r * 101 + 7) % (vocab - 4)) as u32)
        .collect()
}

/// Row `r`: prompt length, tokens to generate, and the step before which it joins. The
/// schedule takes every path of the engine: rows admitted together into an empty batch,
/// joining a full batch (laid out anew), joining with a prompt longer than the batch's
/// columns (laid out anew), taking a slot a finished row left, and the batch compacted
/// once half its slots are free.
const ROWS: [(usize, usize, usize); 8] = [
    (9, 7, 0),
    (23, 12, 0),
    (4, 5, 2),
    (15, 9, 2),
    (40, 4, 3),
    (2, 3, 5),
    (7, 5, 8),
    (11, 6, 9),
];

fn options(max_new_tokens: usize) -> GenerateOptions {
    // No stop tokens: every row generates its whole budget, so rows leave at known steps.
    GenerateOptions {
        max_new_tokens,
        stop_ids: Vec::new(),
        sampling: Sampling::Greedy,
    }
}

#[test]
fn rows_joining_and_leaving_a_running_batch_match_their_single_runs() {
    for model in MODELS {
        // The plan's prefill groups: newcomers in one call, or each alone (a budget of 1
        // byte) and then put together.
        for (attention, group_bytes) in [
            (AttentionKind::FUSED, None),
            (AttentionKind::Reference, None),
            (AttentionKind::FUSED, Some(1)),
            (AttentionKind::Reference, Some(1)),
        ] {
            let mut s = session(model, attention);
            if let Some(bytes) = group_bytes {
                s.plan.prefill_group_logits_bytes = bytes;
            }
            let vocab = s.config().output_vocab();
            let prompts: Vec<Vec<u32>> = ROWS
                .iter()
                .enumerate()
                .map(|(r, &(len, _, _))| prompt(r, len, vocab))
                .collect();
            let recorders: Vec<Recorder> = ROWS.iter().map(|_| Recorder::default()).collect();
            let mut engine = Engine::default();
            let mut ids: Vec<Option<RowId>> = vec![None; ROWS.len()];
            let mut generated = vec![Vec::new(); ROWS.len()];
            let mut widest = 0;
            for step in 0.. {
                let joining: Vec<usize> = (0..ROWS.len()).filter(|&r| ROWS[r].2 == step).collect();
                let admissions = joining
                    .iter()
                    .map(|&r| Admission {
                        prompt: prompts[r].clone(),
                        opts: options(ROWS[r].1),
                        filter: Some(recorders[r].clone()),
                    })
                    .collect();
                for (&r, id) in joining
                    .iter()
                    .zip(engine.admit(&mut s, admissions).unwrap())
                {
                    ids[r] = Some(id);
                }
                widest = widest.max(engine.len());
                if engine.is_empty() && ids.iter().all(Option::is_some) {
                    break;
                }
                for done in engine.step(&mut s).unwrap() {
                    let r = ids.iter().position(|&id| id == Some(done.id)).unwrap();
                    generated[r] = done.decoded.unwrap().generated_ids;
                }
            }
            assert!(widest >= 4, "{model}: the schedule should overlap rows");
            let mut worst = 0f32;
            for (r, &(len, budget, _)) in ROWS.iter().enumerate() {
                let mut alone = Recorder::default();
                let single =
                    generate_filtered(&mut s, &prompts[r], &options(budget), Some(&mut alone))
                        .unwrap();
                assert_eq!(
                    generated[r], single.generated_ids,
                    "{model} {attention} row {r}: tokens"
                );
                let (got, want) = (recorders[r].0.borrow(), alone.0.borrow());
                assert_eq!(got.len(), want.len(), "{model} {attention} row {r}: steps");
                for (step, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    let err = row_error(g, w, 1, vocab);
                    assert!(
                        err <= BOUND,
                        "{model} {attention} row {r} (prompt {len}) step {step}: relative error {err:.2e}"
                    );
                    worst = worst.max(err);
                }
            }
            println!(
                "{model} {attention}, prefill group budget {group_bytes:?}: {} rows, up to {widest} at once, worst step {worst:.2e}",
                ROWS.len()
            );
        }
    }
}

/// A lone prompt that continues one the engine prefilled before is prefilled after that
/// prompt's remembered cache (as a conversation coming back to `needle-run serve` is), and
/// sees its single run's logits at every step; one that continues none is prefilled whole.
/// The remembered prompt is longer than the CPU's prefill piece, so the pieces after it
/// start inside one.
#[test]
fn a_prompt_continuing_a_remembered_one_sees_its_single_run() {
    for model in MODELS {
        for attention in [AttentionKind::FUSED, AttentionKind::Reference] {
            let mut s = session(model, attention);
            let vocab = s.config().output_vocab();
            let max = s.config().max_seq_len();
            let first = prompt(0, (max / 3).min(150), vocab);
            let mut continuing = first.clone();
            continuing.extend(prompt(1, (max / 3).min(150), vocab));
            let other = prompt(2, 20, vocab);
            let mut engine = Engine::with_prefix_reuse(4);
            for (p, cached) in [(&first, 0), (&continuing, first.len()), (&other, 0)] {
                let recorder = Recorder::default();
                let admission = Admission {
                    prompt: p.clone(),
                    opts: options(5),
                    filter: Some(recorder.clone()),
                };
                engine.admit(&mut s, vec![admission]).unwrap();
                let mut decoded = None;
                while decoded.is_none() {
                    decoded = engine.step(&mut s).unwrap().pop();
                }
                let decoded = decoded.unwrap().decoded.unwrap();
                let what = format!("{model} {attention}, prompt of {}", p.len());
                assert_eq!(decoded.cached_prompt_tokens, cached, "{what}");
                let mut alone = Recorder::default();
                let single = generate_filtered(&mut s, p, &options(5), Some(&mut alone)).unwrap();
                assert_eq!(
                    decoded.generated_ids, single.generated_ids,
                    "{what}: tokens"
                );
                let (got, want) = (recorder.0.borrow(), alone.0.borrow());
                assert_eq!(got.len(), want.len(), "{what}: steps");
                for (step, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    let err = row_error(g, w, 1, vocab);
                    assert!(err <= BOUND, "{what} step {step}: relative error {err:.2e}");
                }
            }
        }
    }
}

fn held_out() -> Vec<ToolQuery> {
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let ex: Value = serde_json::from_str(line).unwrap();
            ToolQuery {
                tools: ex["tools"].clone(),
                query: ex["query"].as_str().unwrap().to_string(),
                system: None,
            }
        })
        .collect()
}

/// What an answer says, without its run statistics.
fn said(r: &ToolResponse) -> (Value, bool, String, String, usize) {
    (
        Value::from(r.function_calls.clone()),
        r.success,
        r.reasoning.clone(),
        r.text.clone(),
        r.generated_tokens,
    )
}

#[test]
fn batched_answers_are_the_one_at_a_time_answers() {
    let queries = held_out();
    for constrained in [false, true] {
        let runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
        let mut runner = match constrained {
            true => runner.constrained().unwrap(),
            false => runner,
        };
        let batched = runner.complete_batch(&queries, 128, 16).unwrap();
        let rates: Vec<f64> = batched.iter().map(|a| a.decode_tps).collect();
        let mut single_rates = Vec::new();
        for (q, b) in queries.iter().zip(&batched) {
            let one = runner.complete(&q.tools, &q.query, None, 128).unwrap();
            single_rates.push(one.decode_tps);
            assert_eq!(
                said(&one),
                said(b),
                "constrained={constrained}: {}",
                q.query
            );
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "demo held-out, constrained={constrained}: {} answers equal; per-row decode {:.0} tok/s 16 at a time vs {:.0} one at a time",
            batched.len(),
            mean(&rates),
            mean(&single_rates)
        );
    }
}
