//! The built-in demo model through the ONNX path: the README's example queries
//! and the held-out exact-match accuracy that `runner/demo/README.md` reports
//! for upstream's greedy decoding of the dequantized weights (0.62).

use needle_tests::repo_root;
use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource};
use serde_json::{json, Value};

const UPSTREAM_EXACT_MATCH: usize = 62;

fn demo() -> Runner {
    Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap()
}

#[test]
fn readme_queries_give_upstreams_calls() {
    let tools: Value = serde_json::from_str(runner::load::DEMO_TOOLS).unwrap();
    let mut r = demo();
    let cases = [
        (
            "turn on the bedroom lights at 40 percent",
            json!([{"name":"set_lights","arguments":{"room":"bedroom","on":true,"brightness":40}}]),
        ),
        (
            "set the thermostat to 21 on heat",
            json!([{"name":"set_thermostat","arguments":{"temperature":21,"mode":"heat"}}]),
        ),
        (
            "what's the weather in Paris",
            json!([{"name":"get_weather","arguments":{"city":"Paris"}}]),
        ),
        (
            "turn off the kitchen lights and set a timer for 5 minutes",
            json!([{"name":"set_lights","arguments":{"room":"kitchen","on":false}},{"name":"set_timer","arguments":{"minutes":5}}]),
        ),
        ("tell me a joke", json!([])),
    ];
    for (query, calls) in cases {
        let got = r.complete(&tools, query, None, 128).unwrap();
        assert_eq!(Value::from(got.function_calls), calls, "{query}");
        assert!(got.success);
    }
}

#[test]
fn held_out_exact_match_equals_upstreams() {
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    let mut r = demo();
    let mut hits = 0usize;
    let mut total = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let ex: Value = serde_json::from_str(line).unwrap();
        let got = r
            .complete(&ex["tools"], ex["query"].as_str().unwrap(), None, 128)
            .unwrap();
        total += 1;
        if got.success && Value::from(got.function_calls) == ex["answers"] {
            hits += 1;
        }
    }
    println!("demo held-out exact match through ONNX: {hits}/{total}");
    assert_eq!(total, 100);
    assert!(
        hits.abs_diff(UPSTREAM_EXACT_MATCH) <= 1,
        "exact match {hits}/100, upstream {UPSTREAM_EXACT_MATCH}/100"
    );
}
