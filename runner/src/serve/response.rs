//! The JSON the server answers with: OpenAI's `chat.completion`, its streamed
//! `chat.completion.chunk`s and its error object, plus Needle's extras under `needle`.

use crate::prompt::Answer;
use crate::provider::Provider;
use crate::serve::scheduler::{Done, Sampled};
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
    } else if done.decoded.ran_on {
        "length"
    } else if done.decoded.stopped_on.is_some() || done.decoded.completed_by_filter {
        "stop"
    } else {
        "length"
    }
}

/// One answer of a request (of `n`), finished.
pub struct Choice {
    pub answer: Answer,
    pub done: Box<Done>,
    /// Its tokens' `logprobs.content` entries, when asked for ([`logprob_entry`]).
    pub logprobs: Option<Vec<Value>>,
}

/// A call's id, unique within the completion: its choice and its place in the list.
pub fn call_id(completion_id: &str, choice: usize, i: usize) -> String {
    let completion = completion_id
        .trim_start_matches("chatcmpl-")
        .trim_start_matches("resp_");
    format!("call_{completion}_{choice}_{i}")
}

/// OpenAI's `tool_calls`: each call's name and its arguments as a JSON string.
pub fn tool_calls(answer: &Answer, completion_id: &str, choice: usize) -> Vec<Value> {
    answer
        .function_calls()
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
            let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
            json!({
                "id": call_id(completion_id, choice, i),
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

/// The token counts of a request's answers: its prompt once (every choice shares it),
/// every choice's generated tokens.
/// `cached_tokens`: prompt tokens taken from a prompt the request continues.
pub fn usage<'a>(dones: impl IntoIterator<Item = &'a Done>) -> Value {
    let (mut prompt, mut cached, mut completion) = (0, 0, 0);
    for done in dones {
        prompt = done.decoded.prefill_tokens;
        cached = cached.max(done.decoded.cached_prompt_tokens);
        completion += done.decoded.generated_ids.len();
    }
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// A token's `logprobs.content` entry: its text (`token_bytes`: each id's bytes in a
/// text, as [`exporter::tokenizer::NeedleTokenizer::text_bytes`] gives them), bytes,
/// log-probability and the most likely alternatives.
pub fn logprob_entry(token_bytes: &[Option<Vec<u8>>], sampled: &Sampled) -> Value {
    let token = |id: u32, logprob: f32| {
        let bytes = token_bytes
            .get(id as usize)
            .cloned()
            .flatten()
            .unwrap_or_default();
        json!({"token": String::from_utf8_lossy(&bytes), "logprob": logprob, "bytes": bytes})
    };
    let Some(lp) = &sampled.logprobs else {
        return Value::Null;
    };
    let mut entry = token(sampled.id, lp.logprob);
    entry["top_logprobs"] = lp.top.iter().map(|&(id, l)| token(id, l)).collect();
    entry
}

/// A choice's `logprobs` object: `null` when not asked for.
fn logprobs_object(entries: Option<&[Value]>) -> Value {
    match entries {
        Some(content) => json!({"content": content, "refusal": null}),
        None => Value::Null,
    }
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

/// The whole `chat.completion`: every choice, the usage of all, and Needle's extras of the
/// first at the top (each choice carries its own when there are several).
pub fn completion(meta: &Meta, choices: &[Choice], provider: Provider) -> Value {
    let several = choices.len() > 1;
    let rendered: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let calls = tool_calls(&c.answer, meta.id, index);
            let mut message = json!({"role": "assistant", "content": content(&c.answer)});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            let mut choice = json!({
                "index": index,
                "message": message,
                "finish_reason": finish_reason(&c.answer, &c.done),
                "logprobs": logprobs_object(c.logprobs.as_deref()),
            });
            if several {
                choice["needle"] = needle_extras(&c.answer, &c.done, provider);
            }
            choice
        })
        .collect();
    let first = &choices[0];
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": rendered,
        "usage": usage(choices.iter().map(|c| &*c.done)),
        "needle": needle_extras(&first.answer, &first.done, provider),
    })
}

/// One `chat.completion.chunk` of choice `index` with `delta` (and `finish_reason` on its
/// last), carrying the `logprobs` entries of the tokens since its previous chunk.
pub fn chunk(
    meta: &Meta,
    index: usize,
    delta: Value,
    finish_reason: Option<&str>,
    logprobs: Option<&[Value]>,
) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs_object(logprobs)}],
    })
}

/// OpenAI's error object.
pub fn error(message: &str, kind: &str, param: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": null}})
}

/// Reads and drops a request being refused, up to `max_body` bytes, before it is answered:
/// a connection closed with request bytes still unread is reset, and the reset can reach
/// the client before the answer does ("server disconnected without sending a response");
/// read, the connection also stays open for the client's next request.
pub async fn discard_body(request: axum::extract::Request, max_body: usize) {
    let _ = axum::body::to_bytes(request.into_body(), max_body).await;
}
