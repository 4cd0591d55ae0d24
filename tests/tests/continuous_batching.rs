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

use graphs::contract::{AttentionKind, MatMulWeights};
use needle_tests::{repo_root, row_error, session, session_with, MODELS};
use runner::answer::{Runner, ToolQuery, ToolResponse};
use runner::decode::{GenerateOptions, Sampling, TokenFilter};
use runner::engine::{Admission, Engine, RowId};
use runner::generate::generate_filtered;
use runner::load::{LoadOptions, ModelSource};
use runner::session::NeedleSession;
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
            let what = format!("{model} {attention}");
            let (rows, widest) = run_schedule(&mut s, &ROWS);
            assert!(widest >= 4, "{model}: the schedule should overlap rows");
            let worst = assert_single_runs(&mut s, &ROWS, &rows, &what);
            println!(
                "{what}, prefill group budget {group_bytes:?}: {} rows, up to {widest} at once, worst step {worst:.2e}",
                ROWS.len()
            );
        }
    }
}

/// Row `r`'s prompt for `schedule` in a model of `vocab` tokens.
fn prompts(schedule: &[(usize, usize, usize)], vocab: usize) -> Vec<Vec<u32>> {
    schedule
        .iter()
        .enumerate()
        .map(|(r, &(len, _, _))| prompt(r, len, vocab))
        .collect()
}

/// Runs `schedule` (rows as [`ROWS`] has them) through an engine on `s`: each row's
/// generated tokens and the logits of its steps, and the most rows decoded at once.
fn run_schedule(
    s: &mut NeedleSession,
    schedule: &[(usize, usize, usize)],
) -> (Vec<(Vec<u32>, Recorder)>, usize) {
    let prompts = prompts(schedule, s.config().output_vocab());
    let recorders: Vec<Recorder> = schedule.iter().map(|_| Recorder::default()).collect();
    let mut engine = Engine::default();
    let mut ids: Vec<Option<RowId>> = vec![None; schedule.len()];
    let mut generated = vec![Vec::new(); schedule.len()];
    let mut widest = 0;
    for step in 0.. {
        let joining: Vec<usize> = (0..schedule.len())
            .filter(|&r| schedule[r].2 == step)
            .collect();
        let admissions = joining
            .iter()
            .map(|&r| Admission {
                prompt: prompts[r].clone(),
                opts: options(schedule[r].1),
                filter: Some(recorders[r].clone()),
            })
            .collect();
        for (&r, id) in joining.iter().zip(engine.admit(s, admissions).unwrap()) {
            ids[r] = Some(id);
        }
        widest = widest.max(engine.len());
        if engine.is_empty() && ids.iter().all(Option::is_some) {
            break;
        }
        for done in engine.step(s).unwrap() {
            let r = ids.iter().position(|&id| id == Some(done.id)).unwrap();
            generated[r] = done.decoded.unwrap().generated_ids;
        }
    }
    (generated.into_iter().zip(recorders).collect(), widest)
}

/// Asserts that each row `run_schedule` decoded generated the tokens of its single run on
/// `alone`, seeing its logits at every step; returns the worst step's error.
fn assert_single_runs(
    alone: &mut NeedleSession,
    schedule: &[(usize, usize, usize)],
    rows: &[(Vec<u32>, Recorder)],
    what: &str,
) -> f32 {
    let vocab = alone.config().output_vocab();
    let prompts = prompts(schedule, vocab);
    let mut worst = 0f32;
    for (r, ((generated, recorder), &(len, budget, _))) in rows.iter().zip(schedule).enumerate() {
        let mut single = Recorder::default();
        let decoded =
            generate_filtered(alone, &prompts[r], &options(budget), Some(&mut single)).unwrap();
        assert_eq!(generated, &decoded.generated_ids, "{what} row {r}: tokens");
        let (got, want) = (recorder.0.borrow(), single.0.borrow());
        assert_eq!(got.len(), want.len(), "{what} row {r}: steps");
        for (step, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            let err = row_error(g, w, 1, vocab);
            assert!(
                err <= BOUND,
                "{what} row {r} (prompt {len}) step {step}: relative error {err:.2e}"
            );
            worst = worst.max(err);
        }
    }
    worst
}

/// A sliding cache (`RunPlan::sliding_window`): m64w's layers read the last 24 keys, so
/// with 8-token prefill pieces the engine's cache holds 32 columns and slides every row's
/// oldest tokens out when full, rows of different lengths by different counts, newcomers
/// prefilled together or alone (sliding while they prefill) joining it. Each row sees, at
/// every step, the logits of its single run through a cache that never slides (the plan
/// without the window; that cache against upstream is `conformance.rs`), as does a
/// prompt continuing a remembered one whose cache slid.
#[test]
fn rows_of_a_sliding_cache_see_the_logits_of_a_cache_that_never_slides() {
    const SCHEDULE: [(usize, usize, usize); 6] = [
        (30, 40, 0),
        (9, 50, 0),
        (45, 20, 3),
        (5, 30, 3),
        (70, 12, 10),
        (12, 25, 30),
    ];
    for weights in [MatMulWeights::Float, MatMulWeights::Packed] {
        for group_bytes in [None, Some(1)] {
            let mut sliding = session_with("m64w", AttentionKind::FUSED, weights);
            assert_eq!(sliding.plan.sliding_window, Some(24));
            sliding.plan.prefill_chunk = Some(8);
            if let Some(bytes) = group_bytes {
                sliding.plan.prefill_group_logits_bytes = bytes;
            }
            let mut whole = session_with("m64w", AttentionKind::FUSED, weights);
            whole.plan.sliding_window = None;
            let what = format!("m64w {weights:?} sliding, prefill group budget {group_bytes:?}");
            let (rows, widest) = run_schedule(&mut sliding, &SCHEDULE);
            assert!(widest >= 3, "{what}: the schedule should overlap rows");
            let worst = assert_single_runs(&mut whole, &SCHEDULE, &rows, &what);
            println!("{what}: up to {widest} rows at once, worst step {worst:.2e}");
        }
        let mut sliding = session_with("m64w", AttentionKind::FUSED, weights);
        sliding.plan.prefill_chunk = Some(8);
        let mut whole = session_with("m64w", AttentionKind::FUSED, weights);
        whole.plan.sliding_window = None;
        let what = format!("m64w {weights:?} sliding");
        assert_continuations(&mut sliding, &mut whole, (40, 30), &what);
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
            let mut alone = session(model, attention);
            let third = (s.config().max_seq_len() / 3).min(150);
            let what = format!("{model} {attention}");
            assert_continuations(&mut s, &mut alone, (third, third), &what);
        }
    }
}

/// An engine on `s` that remembers prompts prefills a prompt of `first` tokens, then one
/// continuing it with `added` more (after the first's cache), then one continuing
/// neither (whole): each generates its single run's tokens on `alone`, seeing its logits.
fn assert_continuations(
    s: &mut NeedleSession,
    alone: &mut NeedleSession,
    (first, added): (usize, usize),
    what: &str,
) {
    let vocab = s.config().output_vocab();
    let first = prompt(0, first, vocab);
    let mut continuing = first.clone();
    continuing.extend(prompt(1, added, vocab));
    let other = prompt(2, 20, vocab);
    let mut engine = Engine::with_prefix_reuse(4);
    for (p, cached) in [(&first, 0), (&continuing, first.len()), (&other, 0)] {
        let recorder = Recorder::default();
        let admission = Admission {
            prompt: p.clone(),
            opts: options(5),
            filter: Some(recorder.clone()),
        };
        engine.admit(s, vec![admission]).unwrap();
        let mut decoded = None;
        while decoded.is_none() {
            decoded = engine.step(s).unwrap().pop();
        }
        let decoded = decoded.unwrap().decoded.unwrap();
        let what = format!("{what}, prompt of {}", p.len());
        assert_eq!(decoded.cached_prompt_tokens, cached, "{what}");
        let mut single = Recorder::default();
        let want = generate_filtered(alone, p, &options(5), Some(&mut single)).unwrap();
        assert_eq!(decoded.generated_ids, want.generated_ids, "{what}: tokens");
        let (got, want) = (recorder.0.borrow(), single.0.borrow());
        assert_eq!(got.len(), want.len(), "{what}: steps");
        for (step, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            let err = row_error(g, w, 1, vocab);
            assert!(err <= BOUND, "{what} step {step}: relative error {err:.2e}");
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
