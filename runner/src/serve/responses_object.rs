//! The JSON of the Responses API: the `response` object, its output items (each call a
//! `function_call` item, then the text as a `message` item when there is text or no call)
//! and its usage, plus Needle's extras under `needle`. Item ids follow from the response's
//! id, so a stream's items and the final object's are the same.

use crate::prompt::Answer;
use crate::provider::Provider;
use crate::serve::response::{self, call_id};
use crate::serve::scheduler::Done;
use serde_json::{json, Value};

/// What identifies a response, and what it echoes of its request.
pub struct ResponseMeta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request's body, whose settings the response repeats.
    pub request: Value,
    /// The temperature decoded with (0: greedy).
    pub temperature: f32,
}

fn suffix(id: &str) -> &str {
    id.trim_start_matches("resp_")
}

/// The id of the `function_call` item of call `i`.
pub fn call_item_id(response_id: &str, i: usize) -> String {
    format!("fc_{}_{i}", suffix(response_id))
}

/// The id of the `message` item.
pub fn message_id(response_id: &str) -> String {
    format!("msg_{}", suffix(response_id))
}

/// The call id a tool's output answers (`call_id`), as chat completions spell it.
pub fn function_call_id(response_id: &str, i: usize) -> String {
    call_id(response_id, 0, i)
}

/// Call `i`'s `function_call` item with `arguments` (a JSON text).
pub fn function_call_item(
    response_id: &str,
    i: usize,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": call_item_id(response_id, i),
        "call_id": function_call_id(response_id, i),
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// The `output_text` part of `text`.
pub fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The `message` item: `text` whole, or no content yet while it is in progress.
pub fn message_item(response_id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(output_text).into_iter().collect();
    json!({
        "type": "message",
        "id": message_id(response_id),
        "role": "assistant",
        "status": status,
        "content": content,
    })
}

/// Whether the answer gets a `message` item: it says something, or it calls nothing
/// (Needle's "respond" answer, whose text may be empty).
pub fn has_message(answer: &Answer) -> bool {
    !answer.text.is_empty() || answer.function_calls().is_empty()
}

/// Each call's name and arguments as the answer parsed them (the arguments a JSON text).
pub fn calls(answer: &Answer) -> Vec<(String, String)> {
    answer
        .function_calls()
        .iter()
        .map(|call| {
            let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
            let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
            (name.to_string(), arguments.to_string())
        })
        .collect()
}

/// The output items of a finished answer.
pub fn output(response_id: &str, answer: &Answer) -> Vec<Value> {
    let mut items: Vec<Value> = calls(answer)
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            function_call_item(response_id, i, name, arguments, "completed")
        })
        .collect();
    if has_message(answer) {
        items.push(message_item(response_id, Some(&answer.text), "completed"));
    }
    items
}

/// The Responses API's usage of an answer.
fn usage(done: &Done) -> Value {
    let chat = response::usage([done]);
    json!({
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": chat["prompt_tokens_details"],
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat["total_tokens"],
    })
}

/// Whether the answer ran into `max_output_tokens` or the context's end.
pub fn incomplete(answer: &Answer, done: &Done) -> bool {
    response::finish_reason(answer, done) == "length"
}

/// The `response` object: in progress (no answer yet), or finished with `answer`.
pub fn response_object(
    meta: &ResponseMeta,
    finished: Option<(&Answer, &Done)>,
    provider: Provider,
) -> Value {
    let r = &meta.request;
    let echo = |key: &str, absent: Value| {
        r.get(key)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(absent)
    };
    let mut object = json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "model": meta.model,
        "status": "in_progress",
        "output": [],
        "error": null,
        "incomplete_details": null,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "metadata": echo("metadata", json!({})),
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "temperature": meta.temperature,
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": false,
        "usage": null,
    });
    if let Some((answer, done)) = finished {
        let incomplete = incomplete(answer, done);
        object["status"] = json!(if incomplete {
            "incomplete"
        } else {
            "completed"
        });
        if incomplete {
            object["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        object["output"] = Value::Array(output(&meta.id, answer));
        object["usage"] = usage(done);
        object["needle"] = response::needle_extras(answer, done, provider);
    }
    object
}
