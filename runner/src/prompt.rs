//! The tool-calling chat format of upstream `needle.model.finetune.render_example`:
//!
//! ```text
//! [<|im_start|>system\nSYSTEM<|im_end|>\n]<|im_start|>user\n<tools>TOOLS</tools>\nQUERY<|im_end|>\n<|im_start|>assistant\n
//! ```
//!
//! and the model's answer that follows it,
//! `<think>\nREASONING\n</think>\n<tool_call>CALLS</tool_call><|im_end|>`.
//!
//! A conversation that goes on after a call ([`render_conversation`]) continues that
//! prompt turn by turn:
//!
//! ```text
//! assistant turn:  CALLS_AND_TEXT<|im_end|>\n            (after the open assistant header)
//! tool results:    <|im_start|>user\n<tool_result>RESULTS</tool_result><|im_end|>\n<|im_start|>assistant\n
//! user turn:       <|im_start|>user\nTEXT<|im_end|>\n<|im_start|>assistant\n
//! ```
//!
//! No public source gives these bytes: upstream's Python (`Needle.run`, 2.0.15 and 3.2.8)
//! hands `json.dumps(results)` to the closed engine as the next turn's text, and trains on
//! single turns only. The format rests on what is public: the tokenizers' `<tool_result>`
//! and `</tool_result>` pieces, the chat markers every turn of the trained format uses, an
//! assistant turn written as the trained answer (`<tool_call>` + compact JSON list), the
//! results as one JSON list in call order (as `Needle.run` sends them), and the tools only
//! in the first user turn (the engine pins them as its prefix).

use crate::python_json::PyJson;
use serde_json::Value;

pub use exporter::tokenizer::{IM_END, IM_START};
pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";
const TOOLS_START: &str = "<tools>";
const TOOLS_END: &str = "</tools>";
pub const TOOL_CALL_START: &str = "<tool_call>";
pub const TOOL_CALL_END: &str = "</tool_call>";
pub const TOOL_RESULT_START: &str = "<tool_result>";
pub const TOOL_RESULT_END: &str = "</tool_result>";

/// A turn of a conversation after its first user message.
#[derive(Clone, Debug, PartialEq)]
pub enum Turn {
    /// What the model answered: its calls (a JSON list, `[]` for none) and text.
    Assistant { calls: Value, text: String },
    /// The results of the calls before, in call order.
    ToolResults(Vec<Value>),
    /// A later user message.
    User(String),
}

/// The prompt `render_example({"tools": tools, "query": query, "system": system})`
/// returns, byte for byte. `tools` is written like Python's
/// `json.dumps(tools, separators=(",", ":"), ensure_ascii=False)`; a JSON string
/// is used verbatim, as upstream does with a `str`. A system prompt that is
/// empty after Python's `str.strip` is left out.
pub fn render_prompt(tools: &Value, query: &str, system: Option<&str>) -> String {
    render_conversation(tools, query, system, &[])
}

/// [`render_prompt`] followed by `turns` (the module's format), ending with the open
/// assistant header the model answers after. The assistant header opens after every user
/// side turn (the query, tool results, a user message) that an assistant turn or the end
/// follows, so consecutive user side turns read as one exchange.
pub fn render_conversation(
    tools: &Value,
    query: &str,
    system: Option<&str>,
    turns: &[Turn],
) -> String {
    let tools_json = match tools {
        Value::String(verbatim) => verbatim.clone(),
        other => python_json(other),
    };
    let system = system.map(python_strip).unwrap_or_default();
    let mut prompt = String::new();
    if !system.is_empty() {
        prompt += &format!("{IM_START}system\n{system}{IM_END}\n");
    }
    prompt += &format!("{IM_START}user\n{TOOLS_START}{tools_json}{TOOLS_END}\n{query}{IM_END}\n");
    let answered_next = |i: usize| matches!(turns.get(i), None | Some(Turn::Assistant { .. }));
    if answered_next(0) {
        prompt += &format!("{IM_START}assistant\n");
    }
    for (i, turn) in turns.iter().enumerate() {
        let user_side = match turn {
            Turn::Assistant { calls, text } => {
                let calls = match calls {
                    Value::Array(list) if list.is_empty() && !text.is_empty() => String::new(),
                    calls => format!("{TOOL_CALL_START}{}{TOOL_CALL_END}", python_json(calls)),
                };
                prompt += &format!("{calls}{text}{IM_END}\n");
                continue;
            }
            Turn::ToolResults(results) => {
                let results = python_json(&Value::Array(results.clone()));
                format!("{TOOL_RESULT_START}{results}{TOOL_RESULT_END}")
            }
            Turn::User(text) => text.clone(),
        };
        prompt += &format!("{IM_START}user\n{user_side}{IM_END}\n");
        if answered_next(i + 1) {
            prompt += &format!("{IM_START}assistant\n");
        }
    }
    prompt
}

/// Whether the answer to `turns` follows tool results: there it may be prose (the
/// confirmation after a tool loop) as well as another call.
pub fn answers_tool_results(turns: &[Turn]) -> bool {
    matches!(turns.last(), Some(Turn::ToolResults(_)))
}

/// Python's `str.strip()`: Unicode whitespace plus the separators U+001C..U+001F.
fn python_strip(text: &str) -> &str {
    text.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// `json.dumps(value, separators=(",", ":"), ensure_ascii=False)`.
fn python_json(value: &Value) -> String {
    PyJson::from(value).dumps_compact()
}

/// The parts of a generated answer that tool mode reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The text inside `<think>…</think>`, trimmed (the block may be cut off by
    /// the token limit); empty without one.
    pub reasoning: String,
    /// The JSON list inside `<tool_call>…</tool_call>`, or why there is none:
    /// no block, unterminated block, invalid JSON, or JSON that is not a list.
    pub calls: Result<Value, String>,
    /// What the answer says outside those blocks, up to `<|im_end|>`, trimmed.
    pub text: String,
}

impl Answer {
    /// `function_calls`: the parsed calls; empty when `calls` is an error.
    pub fn function_calls(&self) -> &[Value] {
        match &self.calls {
            Ok(Value::Array(calls)) => calls,
            _ => &[],
        }
    }

    /// `type`: `"call"` when there is at least one call, else `"respond"`.
    pub fn kind(&self) -> &'static str {
        if self.function_calls().is_empty() {
            "respond"
        } else {
            "call"
        }
    }
}

/// Splits a decoded answer (the text generated after the prompt) into
/// reasoning, tool calls and plain text. Never panics.
pub fn parse_answer(text: &str) -> Answer {
    let answer = text.split(IM_END).next().unwrap_or_default();
    let (reasoning, rest) = match take_block(answer, THINK_START, THINK_END) {
        Some(block) => (block.inner.trim().to_string(), block.outside),
        None => (String::new(), answer.to_string()),
    };
    let (calls, rest) = match take_block(&rest, TOOL_CALL_START, TOOL_CALL_END) {
        Some(block) if !block.closed => (
            Err(format!("{TOOL_CALL_START} without {TOOL_CALL_END}")),
            block.outside,
        ),
        Some(block) => (parse_calls(block.inner), block.outside),
        None => (Err(format!("no {TOOL_CALL_START} block")), rest),
    };
    Answer {
        reasoning,
        calls,
        text: rest.trim().to_string(),
    }
}

fn parse_calls(json: &str) -> Result<Value, String> {
    match serde_json::from_str(json.trim()) {
        Ok(list @ Value::Array(_)) => Ok(list),
        Ok(other) => Err(format!("tool call JSON is not a list: {other}")),
        Err(e) => Err(format!("invalid tool call JSON: {e}")),
    }
}

/// The first `open…close` block of `text`: its content (to the end of `text`
/// if `close` never comes) and `text` with the block removed.
struct Block<'a> {
    inner: &'a str,
    outside: String,
    closed: bool,
}

fn take_block<'a>(text: &'a str, open: &str, close: &str) -> Option<Block<'a>> {
    let start = text.find(open)?;
    let after_open = &text[start + open.len()..];
    let (inner, tail, closed) = match after_open.find(close) {
        Some(end) => (&after_open[..end], &after_open[end + close.len()..], true),
        None => (after_open, "", false),
    };
    Some(Block {
        inner,
        outside: format!("{}{tail}", &text[..start]),
        closed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The module's format written out by hand for a tool loop: a call, its result, the
    /// assistant's prose, a later user message.
    #[test]
    fn a_conversation_renders_turn_by_turn() {
        let tools = json!([{"name": "get_weather", "parameters": {"type": "object"}}]);
        let turns = [
            Turn::Assistant {
                calls: json!([{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
                text: String::new(),
            },
            Turn::ToolResults(vec![json!({"sky": "clear", "c": 4.5})]),
            Turn::Assistant {
                calls: json!([]),
                text: "Clear, 4.5 °C.".into(),
            },
            Turn::User("and tomorrow?".into()),
        ];
        let expected = concat!(
            "<|im_start|>system\nBe brief.<|im_end|>\n",
            "<|im_start|>user\n<tools>[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}]</tools>\nweather in Oslo<|im_end|>\n",
            "<|im_start|>assistant\n<tool_call>[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]</tool_call><|im_end|>\n",
            "<|im_start|>user\n<tool_result>[{\"sky\":\"clear\",\"c\":4.5}]</tool_result><|im_end|>\n",
            "<|im_start|>assistant\nClear, 4.5 °C.<|im_end|>\n",
            "<|im_start|>user\nand tomorrow?<|im_end|>\n",
            "<|im_start|>assistant\n",
        );
        let got = render_conversation(&tools, "weather in Oslo", Some("Be brief."), &turns);
        assert_eq!(got, expected);
        // No turns: upstream's single-turn prompt.
        assert_eq!(
            render_conversation(&tools, "q", None, &[]),
            render_prompt(&tools, "q", None)
        );
        assert!(render_prompt(&tools, "q", None).ends_with("q<|im_end|>\n<|im_start|>assistant\n"));
    }

    /// Results followed by a user message are one exchange: the assistant header opens
    /// once, after both.
    #[test]
    fn user_side_turns_in_a_row_open_the_assistant_header_once() {
        let tools = json!([]);
        let turns = [
            Turn::Assistant {
                calls: json!([{"name": "f", "arguments": {}}]),
                text: String::new(),
            },
            Turn::ToolResults(vec![json!("done")]),
            Turn::User("now g".into()),
        ];
        let got = render_conversation(&tools, "q", None, &turns);
        assert!(
            got.ends_with(
                "<|im_start|>user\n<tool_result>[\"done\"]</tool_result><|im_end|>\n<|im_start|>user\nnow g<|im_end|>\n<|im_start|>assistant\n"
            ),
            "{got}"
        );
        assert_eq!(got.matches("<|im_start|>assistant\n").count(), 2);
    }
}
