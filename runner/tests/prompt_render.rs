//! `runner::prompt` against upstream: every prompt in
//! `tests/fixtures/prompt.cases.json` was rendered by cactus-needle's
//! `render_example` (see `tests/fixtures/make_prompt_cases.py`), and every
//! target there is the answer format the model was trained to produce.

use runner::prompt::{parse_answer, render_prompt};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    tools: Value,
    query: String,
    system: Option<String>,
    reasoning: Option<String>,
    answers: Value,
    prompt: String,
    target: String,
}

fn cases() -> Vec<Case> {
    let path = test_support::fixture("prompt.cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str::<Fixture>(&text)
        .expect("fixture parses")
        .cases
}

#[test]
fn prompts_match_upstream_render_example() {
    let cases = cases();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let prompt = render_prompt(&c.tools, &c.query, c.system.as_deref());
            (prompt != c.prompt).then(|| {
                format!(
                    "{}:\n  got      {prompt:?}\n  upstream {:?}",
                    c.name, c.prompt
                )
            })
        })
        .collect();
    println!(
        "prompts: {}/{} byte-identical",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn parse_answer_recovers_upstream_targets() {
    for c in cases() {
        let answer = parse_answer(&c.target);
        let reasoning = c.reasoning.as_deref().unwrap_or_default().trim();
        assert_eq!(answer.reasoning, reasoning, "{}", c.name);
        assert_eq!(answer.calls.as_ref(), Ok(&c.answers), "{}", c.name);
        assert_eq!(
            answer.function_calls(),
            c.answers.as_array().unwrap().as_slice(),
            "{}",
            c.name
        );
        let kind = if c.answers.as_array().unwrap().is_empty() {
            "respond"
        } else {
            "call"
        };
        assert_eq!(answer.kind(), kind, "{}", c.name);
        assert_eq!(answer.text, "", "{}", c.name);
    }
}

#[test]
fn parse_answer_reports_broken_calls_without_panicking() {
    let bad_json =
        parse_answer("<think>\nx\n</think>\n<tool_call>[{\"name\":</tool_call><|im_end|>");
    assert_eq!(bad_json.reasoning, "x");
    assert!(bad_json
        .calls
        .as_ref()
        .unwrap_err()
        .starts_with("invalid tool call JSON"));
    assert_eq!(
        (bad_json.kind(), bad_json.function_calls()),
        ("respond", &[][..])
    );

    let not_a_list = parse_answer("<tool_call>{\"name\":\"f\"}</tool_call>");
    assert!(not_a_list.calls.unwrap_err().contains("not a list"));

    let unterminated = parse_answer("<think>\nstill thinking");
    assert_eq!(unterminated.reasoning, "still thinking");
    assert_eq!(unterminated.calls, Err("no <tool_call> block".to_string()));

    let cut_off = parse_answer("<tool_call>[{\"name\":\"f\",\"arguments\":{}}]");
    assert_eq!(
        cut_off.calls,
        Err("<tool_call> without </tool_call>".to_string())
    );
}

#[test]
fn parse_answer_keeps_plain_text_outside_the_blocks() {
    let answer = parse_answer(
        "Sure.\n<think>\nuser wants f\n</think>\n<tool_call>[{\"name\":\"f\",\"arguments\":{\"x\":1.5}}]</tool_call> Done.<|im_end|>ignored",
    );
    assert_eq!(answer.text, "Sure.\n\n Done.");
    assert_eq!(
        answer.calls,
        Ok(json!([{"name": "f", "arguments": {"x": 1.5}}]))
    );
    assert_eq!(answer.kind(), "call");

    let reply = parse_answer("Hello there!<|im_end|>");
    assert_eq!(
        (reply.text.as_str(), reply.reasoning.as_str(), reply.kind()),
        ("Hello there!", "", "respond")
    );
}
