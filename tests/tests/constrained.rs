//! `--constrain`: every tool-mode answer is a `<tool_call>` list of declared tools whose
//! arguments satisfy their JSON schemas, checked by an independent validator (Python
//! `jsonschema`, tests/python/validate_calls.py) on the demo model's held-out set and on
//! adversarial tool lists (enums, nested objects, arrays, integer vs number, required
//! keys, names that share prefixes, OpenAI's tool form).

use needle_tests::{python, repo_root, scratch};
use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource};
use serde_json::{json, Value};

fn demo(constrained: bool) -> Runner {
    let runner = Runner::new(&ModelSource::Demo, &LoadOptions::default()).unwrap();
    match constrained {
        true => runner.constrained().unwrap(),
        false => runner,
    }
}

/// The held-out examples: (tools, query, expected calls).
fn held_out() -> Vec<(Value, String, Value)> {
    let text = std::fs::read_to_string(repo_root().join("runner/demo/eval.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let ex: Value = serde_json::from_str(line).unwrap();
            let query = ex["query"].as_str().unwrap().to_string();
            (ex["tools"].clone(), query, ex["answers"].clone())
        })
        .collect()
}

/// Runs the validator on `(tools, answer)` rows: (valid, total, first reasons).
fn validate(name: &str, rows: &[(Value, Value)]) -> (usize, usize, Vec<Value>) {
    // One folder per call: the tests of this file run at once, and scratch() empties it.
    let path = scratch(&format!("constrained-{name}")).join("answers.jsonl");
    let lines: Vec<String> = rows
        .iter()
        .map(|(tools, answer)| json!({"tools": tools, "answer": answer}).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let out = python()
        .arg(repo_root().join("tests/python/validate_calls.py"))
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let count = |k: &str| report[k].as_u64().unwrap() as usize;
    let invalid = report["invalid"].as_array().unwrap();
    (
        count("valid"),
        count("total"),
        invalid.iter().take(5).cloned().collect(),
    )
}

#[test]
fn constrained_held_out_answers_are_all_valid_and_as_accurate() {
    let mut results = Vec::new();
    for constrained in [false, true] {
        let mut runner = demo(constrained);
        let mut rows = Vec::new();
        let mut exact = 0;
        for (tools, query, expected) in held_out() {
            let answer = runner.complete(&tools, &query, None, 128).unwrap();
            exact += usize::from(
                answer.success && Value::from(answer.function_calls.clone()) == expected,
            );
            rows.push((tools, serde_json::to_value(&answer).unwrap()));
        }
        let name = if constrained { "constrained" } else { "free" };
        let (valid, total, invalid) = validate(name, &rows);
        println!("demo held-out, {name}: {valid}/{total} valid, exact match {exact}/{total}, first invalid {invalid:?}");
        results.push((valid, total, exact, invalid));
    }
    let (free, constrained) = (&results[0], &results[1]);
    assert_eq!(constrained.0, constrained.1, "invalid: {:?}", constrained.3);
    assert!(
        constrained.2 >= free.2,
        "constraining lost exact matches: {} vs {}",
        constrained.2,
        free.2
    );
}

/// Tool lists the demo model was never trained on: under the constraint it still only
/// produces calls they allow.
fn adversarial_tool_lists() -> Vec<Value> {
    vec![
        json!([
            {"name": "get", "description": "Get a thing.", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
            {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}},
            {"name": "get_weather_alerts", "description": "Alerts.", "parameters": {"type": "object", "properties": {"region": {"type": "string", "enum": ["north", "south"]}}, "required": ["region"]}}
        ]),
        json!([
            {"name": "set_lights", "description": "Lights.", "parameters": {"type": "object", "properties": {
                "room": {"type": "string", "enum": ["attic", "cellar"]},
                "level": {"type": "number"},
                "count": {"type": "integer"},
                "on": {"type": "boolean"}
            }, "required": ["room", "level", "count", "on"]}}
        ]),
        json!([
            {"type": "function", "function": {"name": "book_trip", "description": "Book a trip.", "parameters": {"type": "object", "properties": {
                "traveler": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]},
                "stops": {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}}, "required": ["city", "nights"]}, "maxItems": 3},
                "class": {"enum": ["economy", "business", 1]}
            }, "required": ["traveler", "stops"]}}}
        ]),
        json!([
            {"name": "set_timer", "description": "Timer.", "parameters": {"minutes": {"type": "integer"}, "label": {"type": "string"}}}
        ]),
    ]
}

#[test]
fn constrained_answers_satisfy_adversarial_schemas() {
    let mut runner = demo(true);
    let queries: Vec<String> = held_out().into_iter().take(8).map(|(_, q, _)| q).collect();
    let mut rows = Vec::new();
    for tools in adversarial_tool_lists() {
        for query in &queries {
            let answer = runner.complete(&tools, query, None, 160).unwrap();
            rows.push((tools.clone(), serde_json::to_value(&answer).unwrap()));
        }
    }
    let (valid, total, invalid) = validate("adversarial", &rows);
    println!("adversarial schemas, constrained: {valid}/{total} valid");
    assert_eq!(valid, total, "invalid: {invalid:?}");
}

/// The validator is not vacuous: it rejects what free decoding produces for tools the
/// model does not know.
#[test]
fn the_validator_rejects_undeclared_calls() {
    let tools = adversarial_tool_lists().remove(1);
    let rows = [
        (
            tools.clone(),
            json!({"success": true, "function_calls": [{"name": "set_timer", "arguments": {}}]}),
        ),
        (
            tools.clone(),
            json!({"success": true, "function_calls": [{"name": "set_lights", "arguments": {"room": "kitchen", "level": 1, "count": 1, "on": true}}]}),
        ),
        (
            tools.clone(),
            json!({"success": true, "function_calls": [{"name": "set_lights", "arguments": {"room": "attic", "level": 1, "count": 1.5, "on": true}}]}),
        ),
        (
            tools.clone(),
            json!({"success": true, "function_calls": [{"name": "set_lights", "arguments": {"room": "attic", "level": 1, "count": 1, "on": true, "x": 0}}]}),
        ),
        (
            tools.clone(),
            json!({"success": false, "function_calls": []}),
        ),
        (
            tools,
            json!({"success": true, "function_calls": [{"name": "set_lights", "arguments": {"room": "attic", "level": 0.5, "count": 2, "on": false}}]}),
        ),
    ];
    let (valid, total, _) = validate("validator", &rows);
    assert_eq!((valid, total), (1, 6));
}
