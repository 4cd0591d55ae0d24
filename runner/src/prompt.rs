//! The tool-calling chat format of upstream `needle.model.finetune.render_example`:
//!
//! ```text
//! [<|im_start|>system\nSYSTEM<|im_end|>\n]<|im_start|>user\n<tools>TOOLS</tools>\nQUERY<|im_end|>\n<|im_start|>assistant\n
//! ```
//!
//! and the model's answer that follows it,
//! `<think>\nREASONING\n</think>\n<tool_call>CALLS</tool_call><|im_end|>`.

use crate::python_json::PyJson;
use serde_json::Value;

pub use exporter::tokenizer::{IM_END, IM_START};
pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";
const TOOLS_START: &str = "<tools>";
const TOOLS_END: &str = "</tools>";
pub const TOOL_CALL_START: &str = "<tool_call>";
pub const TOOL_CALL_END: &str = "</tool_call>";

/// The prompt `render_example({"tools": tools, "query": query, "system": system})`
/// returns, byte for byte. `tools` is written like Python's
/// `json.dumps(tools, separators=(",", ":"), ensure_ascii=False)`; a JSON string
/// is used verbatim, as upstream does with a `str`. A system prompt that is
/// empty after Python's `str.strip` is left out.
pub fn render_prompt(tools: &Value, query: &str, system: Option<&str>) -> String {
    let tools_json = match tools {
        Value::String(verbatim) => verbatim.clone(),
        other => python_json(other),
    };
    let system = system.map(python_strip).unwrap_or_default();
    let mut prompt = String::new();
    if !system.is_empty() {
        prompt += &format!("{IM_START}system\n{system}{IM_END}\n");
    }
    prompt += &format!(
        "{IM_START}user\n{TOOLS_START}{tools_json}{TOOLS_END}\n{query}{IM_END}\n{IM_START}assistant\n"
    );
    prompt
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
