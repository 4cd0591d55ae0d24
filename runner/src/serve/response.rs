//! The JSON the server answers with: OpenAI's `chat.completion`, its streamed
//! `chat.completion.chunk`s and its error object, plus Needle's extras under `needle`.

use crate::prompt::Answer;
use crate::provider::Provider;
use crate::serve::scheduler::Done;
use serde_json::{json, Value};

/// What identifies one completion in every object about it.
pub struct Meta<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

/// Why the answer ended (`finish_reason`): it calls tools, it ended itself or at a stop
/// sequence, or it ran into `max_tokens` or the context's end.
pub fn finish_reason(answer: &Answer, done: &Done) -> &'static str {
    if !answer.function_calls().is_empty() {
        "tool_calls"
    } else if done.decoded.stopped_on.is_some() || done.decoded.completed_by_filter {
        "stop"
    } else {
        "length"
    }
}

/// OpenAI's `tool_calls`: each call's name and its arguments as a JSON string.
pub fn tool_calls(answer: &Answer, completion_id: &str) -> Vec<Value> {
    answer
        .function_calls()
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
            let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
            json!({
                "id": format!("call_{}_{i}", completion_id.trim_start_matches("chatcmpl-")),
                "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()},
            })
        })
        .collect()
}

/// The answer's text as `content` (empty for Needle's "respond" answer, which has no
/// text), `null` when it only calls tools.
fn content(answer: &Answer) -> Value {
    match (answer.text.is_empty(), answer.function_calls().is_empty()) {
        (true, false) => Value::Null,
        _ => Value::String(answer.text.clone()),
    }
}

pub fn usage(done: &Done) -> Value {
    let prompt = done.decoded.prefill_tokens;
    let completion = done.decoded.generated_ids.len();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// Needle's extras: the reasoning, the confidence head, whether the `<tool_call>` block
/// parsed, the provider and where the time went.
pub fn needle_extras(answer: &Answer, done: &Done, provider: Provider) -> Value {
    let g = &done.decoded;
    let ms = |secs: f64| (secs * 1e4).round() / 10.0;
    json!({
        "reasoning": answer.reasoning,
        "confidence": done.confidence,
        "success": answer.calls.is_ok(),
        "error": answer.calls.as_ref().err(),
        "provider": provider,
        "timings": {
            "queue_ms": ms(done.queue_secs),
            "prefill_ms": ms(g.prefill_secs),
            "decode_ms": ms(g.decode_secs),
            "prefill_tps": g.prefill_tps(),
            "decode_tps": g.decode_tps(),
        },
    })
}

/// The whole `chat.completion`.
pub fn completion(meta: &Meta, answer: &Answer, done: &Done, provider: Provider) -> Value {
    let calls = tool_calls(answer, meta.id);
    let mut message = json!({"role": "assistant", "content": content(answer)});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(answer, done), "logprobs": null}],
        "usage": usage(done),
        "needle": needle_extras(answer, done, provider),
    })
}

/// One `chat.completion.chunk` with `delta` (and `finish_reason` on the last).
pub fn chunk(meta: &Meta, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null}],
    })
}

/// The streamed calls: one delta per call, whole, each with its `index`.
pub fn tool_call_deltas(answer: &Answer, completion_id: &str) -> Vec<Value> {
    tool_calls(answer, completion_id)
        .into_iter()
        .enumerate()
        .map(|(i, mut call)| {
            call["index"] = json!(i);
            json!({"tool_calls": [call]})
        })
        .collect()
}

/// OpenAI's error object.
pub fn error(message: &str, kind: &str, param: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": null}})
}
