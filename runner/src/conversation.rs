//! OpenAI `messages` (a chat request's, or `needle-run --messages`'s file) read as a Needle
//! conversation ([`crate::prompt::render_conversation`]):
//! system and developer messages, wherever they are, join into the system text; the first
//! user message is the query (the turn the tools are written in); after it come the
//! assistant's turns (its `tool_calls` and text), the tools' results (each `tool` message
//! answering one of the calls before it, merged into one list in call order) and later user
//! messages. The last turn must be one to answer: a user message or tool results.

use crate::prompt::Turn;
use serde_json::{json, Value};

/// A refusal of `messages`: what is wrong, naming the message.
pub type Refusal = String;

/// The conversation a request's `messages` hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    pub system: Option<String>,
    pub query: String,
    pub turns: Vec<Turn>,
}

/// Reads `messages`, a JSON list.
pub fn read(messages: &[Value]) -> Result<Conversation, Refusal> {
    let mut system = Vec::new();
    let mut query: Option<String> = None;
    let mut turns: Vec<Turn> = Vec::new();
    // The ids of the last assistant turn's calls, which tool messages answer.
    let mut open_calls: Vec<String> = Vec::new();
    let mut results: Vec<(usize, Value)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("messages[{i}] has no role string"))?;
        if role != "tool" {
            flush_results(&mut results, &mut turns);
        }
        match role {
            "system" | "developer" => system.push(text(m.get("content"), i)?),
            "user" if query.is_none() => query = Some(text(m.get("content"), i)?),
            "user" => turns.push(Turn::User(text(m.get("content"), i)?)),
            _ if query.is_none() => {
                return Err(format!(
                    "messages[{i}]: a {role} message before the first user message"
                ))
            }
            "assistant" => {
                let (ids, calls) = tool_calls(m.get("tool_calls"), i)?;
                let said = match m.get("content") {
                    None | Some(Value::Null) => String::new(),
                    content => text(content, i)?,
                };
                open_calls = ids;
                match turns.last_mut() {
                    // Two assistant messages in a row are one turn (text, then its calls).
                    Some(Turn::Assistant {
                        calls: before,
                        text,
                    }) => {
                        if let (Value::Array(before), Value::Array(more)) = (before, calls) {
                            before.extend(more);
                        }
                        text.push_str(&said);
                    }
                    _ => turns.push(Turn::Assistant { calls, text: said }),
                }
            }
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("messages[{i}]: a tool message needs tool_call_id"))?;
                let position = open_calls.iter().position(|c| c == id).ok_or_else(|| {
                    format!("messages[{i}]: tool_call_id {id:?} answers no call of the assistant turn before it")
                })?;
                if results.iter().any(|(p, _)| *p == position) {
                    return Err(format!("messages[{i}]: call {id:?} is answered twice"));
                }
                results.push((position, result_value(&text(m.get("content"), i)?)));
            }
            "function" => {
                return Err(format!(
                    "messages[{i}]: function messages are deprecated; send tool messages"
                ))
            }
            other => return Err(format!("messages[{i}]: unknown role {other:?}")),
        }
    }
    flush_results(&mut results, &mut turns);
    let query = query.ok_or("messages need a user message")?;
    if query.trim().is_empty() {
        return Err("the user message is empty".into());
    }
    if matches!(turns.last(), Some(Turn::Assistant { .. })) {
        return Err(
            "the last message is the assistant's: there is nothing to answer (end with a user \
             message or tool results)"
                .into(),
        );
    }
    let system = Some(system.join("\n\n")).filter(|s| !s.is_empty());
    Ok(Conversation {
        system,
        query,
        turns,
    })
}

/// The pending tool messages as one turn, in the order of the calls they answer.
fn flush_results(results: &mut Vec<(usize, Value)>, turns: &mut Vec<Turn>) {
    if results.is_empty() {
        return;
    }
    results.sort_by_key(|(position, _)| *position);
    turns.push(Turn::ToolResults(
        results.drain(..).map(|(_, v)| v).collect(),
    ));
}

/// A tool's output as the JSON value it is, or as a string when it is not JSON.
fn result_value(output: &str) -> Value {
    serde_json::from_str(output).unwrap_or_else(|_| Value::String(output.to_string()))
}

/// An assistant message's `tool_calls` as their ids and Needle's calls
/// (`[{"name", "arguments"}]`, the arguments parsed from their JSON text).
fn tool_calls(calls: Option<&Value>, i: usize) -> Result<(Vec<String>, Value), Refusal> {
    let list = match calls {
        None | Some(Value::Null) => return Ok((Vec::new(), json!([]))),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(format!("messages[{i}].tool_calls must be a list")),
    };
    let mut ids = Vec::with_capacity(list.len());
    let mut out = Vec::with_capacity(list.len());
    for (k, call) in list.iter().enumerate() {
        let what = || format!("messages[{i}].tool_calls[{k}]");
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        let function = call
            .get("function")
            .ok_or_else(|| format!("{} has no function", what()))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{}.function has no name", what()))?;
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) if text.trim().is_empty() => json!({}),
            Some(Value::String(text)) => serde_json::from_str(text)
                .map_err(|e| format!("{}.function.arguments is not JSON: {e}", what()))?,
            Some(object @ Value::Object(_)) => object.clone(),
            _ => return Err(format!("{}.function has no arguments", what())),
        };
        ids.push(id.to_string());
        out.push(json!({"name": name, "arguments": arguments}));
    }
    Ok((ids, Value::Array(out)))
}

/// A message's text: a string, or a list of `{"type": "text", "text": …}` parts.
pub fn text(content: Option<&Value>, i: usize) -> Result<String, Refusal> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    (kind, _) => Err(format!(
                        "messages[{i}]: only text content parts are supported, not {}",
                        kind.unwrap_or("an untyped part")
                    )),
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(|parts| parts.concat()),
        _ => Err(format!("messages[{i}] has no text content")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str, args: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
    }

    #[test]
    fn a_tool_loop_reads_as_its_turns() {
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "kitchen lights off and weather in Oslo"},
            {"role": "assistant", "content": null, "tool_calls": [
                call("a", "set_lights", r#"{"room":"kitchen","on":false}"#),
                call("b", "get_weather", r#"{"city":"Oslo"}"#),
            ]},
            // Answered out of order; the second is not JSON.
            {"role": "tool", "tool_call_id": "b", "content": "sunny"},
            {"role": "tool", "tool_call_id": "a", "content": "{\"ok\": true}"},
            {"role": "developer", "content": "Answer in one line."},
            {"role": "assistant", "content": "Done: lights off, sunny in Oslo."},
            {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
        ]);
        let c = read(messages.as_array().unwrap()).unwrap();
        assert_eq!(
            c.system.as_deref(),
            Some("Be brief.\n\nAnswer in one line.")
        );
        assert_eq!(c.query, "kitchen lights off and weather in Oslo");
        assert_eq!(
            c.turns,
            vec![
                Turn::Assistant {
                    calls: json!([
                        {"name": "set_lights", "arguments": {"room": "kitchen", "on": false}},
                        {"name": "get_weather", "arguments": {"city": "Oslo"}},
                    ]),
                    text: String::new(),
                },
                Turn::ToolResults(vec![json!({"ok": true}), json!("sunny")]),
                Turn::Assistant {
                    calls: json!([]),
                    text: "Done: lights off, sunny in Oslo.".into(),
                },
                Turn::User("thanks".into()),
            ]
        );
    }

    #[test]
    fn what_cannot_be_a_conversation_is_refused_naming_the_message() {
        let user = json!({"role": "user", "content": "hi"});
        let calls = json!({"role": "assistant", "tool_calls": [call("a", "f", "{}")]});
        let cases = [
            (
                json!([{"role": "assistant", "content": "x"}, user]),
                "messages[0]",
            ),
            (
                json!([user, {"role": "assistant", "content": "x"}]),
                "nothing to answer",
            ),
            (
                json!([user, calls, {"role": "tool", "tool_call_id": "z", "content": "1"}]),
                "answers no call",
            ),
            (
                json!([user, calls, {"role": "tool", "tool_call_id": "a", "content": "1"},
                       {"role": "tool", "tool_call_id": "a", "content": "2"}]),
                "answered twice",
            ),
            (
                json!([user, {"role": "assistant", "tool_calls": [call("a", "f", "{oops")]}]),
                "not JSON",
            ),
            (
                json!([user, {"role": "function", "content": "1"}]),
                "deprecated",
            ),
            (json!([]), "need a user message"),
        ];
        for (messages, says) in cases {
            let e = read(messages.as_array().unwrap()).unwrap_err();
            assert!(e.contains(says), "{messages}: {e}");
        }
    }
}
