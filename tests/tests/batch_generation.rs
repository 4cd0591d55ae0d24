//! `Runner::complete_batch` (`needle-run --batch`): queries decoded together through the
//! batch-exact graph give each query's one-at-a-time answer, free and constrained, on the
//! demo model's held-out set (16 rows at a time, the next query joining as a row is done;
//! prompts of different lengths, answers that end at different steps).

use needle_tests::repo_root;
use runner::answer::{Runner, ToolQuery, ToolResponse};
use runner::load::{LoadOptions, ModelSource};
use serde_json::Value;

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
