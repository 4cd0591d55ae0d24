//! The agent frameworks' own documented tool-calling paths against `needle-run serve` on the
//! built-in demo model: langchain-openai, openai-agents and pydantic-ai (`.venv-frameworks`),
//! llama-index (`.venv-llama-index`) and instructor (`.venv-instructor`), pinned in
//! `scripts/requirements-*.txt`. Each script of `tests/python/frameworks/` declares the demo's
//! tools the framework's way (typed, documented functions; a Pydantic model) and reports what
//! the framework got (the report's shape: `home.py`). Judged here against the held-out answers
//! of `runner/demo/eval.jsonl`:
//!
//! - the first calls on the 100 held-out queries are right at least as often as the same
//!   queries through `needle-run` (the `Runner` API, greedy, the tools as `tools.json` has them);
//! - the agent loop (the tool runs, its result goes back, the model answers) completes without
//!   an error, with a tool run and a short prose answer, on at least 6 of 8 held-out queries;
//! - structured output through the framework's default method gives the query's `Lights`;
//! - streaming: the loop of the first loop query (instructor: the structured query) through the
//!   framework's streaming path completes as the plain one must.

mod support;

use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource};
use serde_json::{json, Value};
use std::fmt::Write as _;
use support::server::Server;
use test_support::{python_in, repo_root};

/// (framework, its venv, its script).
const FRAMEWORKS: [(&str, &str, &str); 5] = [
    ("langchain-openai", ".venv-frameworks", "langchain_run.py"),
    ("openai-agents", ".venv-frameworks", "agents_run.py"),
    ("pydantic-ai", ".venv-frameworks", "pydantic_ai_run.py"),
    ("llama-index", ".venv-llama-index", "llama_index_run.py"),
    ("instructor", ".venv-instructor", "instructor_run.py"),
];

const LOOPS: usize = 8;
const LOOPS_NEEDED: usize = 6;
/// The longest final answer still called a short confirmation.
const SHORT_ANSWER_CHARS: usize = 240;

fn held_out() -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn tool_names(example: &Value) -> Value {
    let names = example["tools"].as_array().unwrap().iter();
    names.map(|t| t["name"].clone()).collect()
}

/// Held-out queries with one expected call, the first of each tool before repeats, so the
/// loops exercise every tool the held-out set has.
fn loop_queries(examples: &[Value]) -> Vec<&Value> {
    let single: Vec<&Value> = examples
        .iter()
        .filter(|e| e["answers"].as_array().unwrap().len() == 1)
        .collect();
    let mut picked: Vec<&Value> = Vec::new();
    for e in &single {
        let tool = &e["answers"][0]["name"];
        if !picked.iter().any(|p| &p["answers"][0]["name"] == tool) {
            picked.push(e);
        }
    }
    for e in &single {
        if picked.len() == LOOPS {
            break;
        }
        if !picked.iter().any(|p| std::ptr::eq(*p, *e)) {
            picked.push(e);
        }
    }
    picked.truncate(LOOPS);
    picked
}

/// The first held-out query whose answer is one `set_lights` call with a room and on/off
/// only: what the framework's `Lights` must hold.
fn structured_query(examples: &[Value]) -> (&str, Value) {
    let example = examples
        .iter()
        .find(|e| {
            let answers = e["answers"].as_array().unwrap();
            let args = &answers[0]["arguments"];
            answers.len() == 1
                && answers[0]["name"] == "set_lights"
                && args.as_object().unwrap().len() == 2
        })
        .expect("eval.jsonl has a set_lights query with room and on only");
    let query = example["query"].as_str().unwrap();
    (query, example["answers"][0]["arguments"].clone())
}

/// JSON equality with numbers compared as numbers (a framework may turn 20 into 20.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// The calls a framework reported for one query, if it reported calls (not an error).
fn right_calls(reported: &Value, answers: &Value) -> bool {
    reported.is_array() && same(reported, answers)
}

/// Why a loop's report is not a completed loop with a short prose answer, or `None`.
fn loop_fault(report: &Value) -> Option<String> {
    if let Some(e) = report["error"].as_str() {
        return Some(format!("error: {e}"));
    }
    if report["calls"].as_array().is_none_or(Vec::is_empty) {
        return Some("no tool ran".into());
    }
    let answer = report["final"].as_str().unwrap_or_default().trim();
    if answer.is_empty() {
        return Some("empty answer".into());
    }
    if answer.contains(['<', '>', '{', '}']) || answer.chars().count() > SHORT_ANSWER_CHARS {
        return Some(format!("not a short prose answer: {answer:?}"));
    }
    None
}

fn needle_run_hits(examples: &[Value]) -> Vec<bool> {
    let options = LoadOptions::default();
    let mut runner = Runner::new(&ModelSource::Demo, &options).unwrap();
    examples
        .iter()
        .map(|e| {
            let query = e["query"].as_str().unwrap();
            let got = runner.complete(&e["tools"], query, None, 128).unwrap();
            got.success && same(&Value::from(got.function_calls), &e["answers"])
        })
        .collect()
}

#[test]
fn frameworks_call_loop_structure_and_stream_on_the_demo() {
    let examples = held_out();
    let loops = loop_queries(&examples);
    let (structured, lights) = structured_query(&examples);
    let spec = json!({
        "model": "needle-demo",
        "calls": examples.iter().map(|e| json!({"query": e["query"], "tools": tool_names(e)})).collect::<Vec<_>>(),
        "loops": loops.iter().map(|e| json!({"query": e["query"], "tools": tool_names(e)})).collect::<Vec<_>>(),
        "structured": {"query": structured},
    });
    let needle_run = needle_run_hits(&examples);
    let baseline = needle_run.iter().filter(|&&h| h).count();

    let server = Server::start(&[]);
    let script_dir = repo_root().join("tests/python/frameworks");
    let mut table = format!("needle-run: {baseline}/100 right calls\n");
    let mut faults = Vec::new();
    for (framework, venv, script) in FRAMEWORKS {
        let report = server.run(python_in(venv), &script_dir.join(script), spec.clone());
        let calls = report["calls"].as_array().unwrap();
        let hits = calls
            .iter()
            .zip(&examples)
            .filter(|(c, e)| right_calls(c, &e["answers"]))
            .count();
        if hits < baseline {
            faults.push(format!(
                "{framework}: {hits}/100 right calls, needle-run {baseline}"
            ));
        }
        let completed = match report["loops"].as_array() {
            Some(runs) => {
                let loop_faults: Vec<String> = runs.iter().filter_map(loop_fault).collect();
                if runs.len() - loop_faults.len() < LOOPS_NEEDED {
                    faults.push(format!("{framework}: loops {loop_faults:?}"));
                }
                format!("{}/{}", runs.len() - loop_faults.len(), runs.len())
            }
            None => "none (no agent loop)".into(),
        };
        let value = &report["structured"]["value"];
        if !same(value, &lights) {
            faults.push(format!(
                "{framework}: structured {} for {structured:?}, want {lights}",
                report["structured"]
            ));
        }
        let stream = &report["stream"];
        let stream_fault = match report["loops"].is_array() {
            true => loop_fault(stream),
            false => (!same(&stream["value"], &lights)).then(|| format!("{stream}")),
        };
        if let Some(f) = &stream_fault {
            faults.push(format!("{framework}: streaming {f}"));
        }
        writeln!(
            table,
            "{framework}: {hits}/100 right calls, loops {completed}, structured {}, streaming {}",
            if same(value, &lights) {
                "right"
            } else {
                "wrong"
            },
            stream_fault.as_deref().unwrap_or("ok"),
        )
        .unwrap();
    }
    println!("{table}");
    assert!(faults.is_empty(), "{table}\n{}", faults.join("\n"));
}
