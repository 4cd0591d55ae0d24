//! A Responses API request (`POST /v1/responses`) read as the chat-completions request it
//! means, so that one reader ([`request::parse`]) checks both: `instructions` and
//! system/developer input items become the system text, the user item the query,
//! function tools (`{"type": "function", "name", …}`) OpenAI's chat form, `tool_choice`,
//! `max_output_tokens`, `temperature`, `parallel_tool_calls` and `stream` their chat
//! fields. The subset is what openai-agents sends by default for function tools. Nothing
//! is stored, so what needs a stored response (`previous_response_id`, `conversation`)
//! is refused; a conversation is sent whole, its calls (`function_call` items) and their
//! outputs (`function_call_output`) read as the chat messages they are.

use crate::serve::request::{self, ChatRequest, Invalid};
use serde_json::{json, Map, Value};

fn invalid(param: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        message: message.into(),
        param: Some(param),
    }
}

/// Reads the request body (already parsed as JSON).
pub fn parse(body: &Value) -> Result<ChatRequest, Invalid> {
    let Value::Object(body) = body else {
        return Err(Invalid {
            message: "the request body must be a JSON object".into(),
            param: None,
        });
    };
    let chat = to_chat(body)?;
    request::parse(&chat).map_err(|e| Invalid {
        param: e.param.map(responses_param),
        ..e
    })
}

/// The Responses API's name of a chat-completions field.
fn responses_param(chat: &'static str) -> &'static str {
    match chat {
        "messages" => "input",
        "max_tokens" => "max_output_tokens",
        "response_format" => "text",
        other => other,
    }
}

fn to_chat(body: &Map<String, Value>) -> Result<Value, Invalid> {
    for stored in ["previous_response_id", "conversation"] {
        if body.get(stored).is_some_and(|v| !v.is_null()) {
            return Err(invalid(
                stored,
                format!("{stored} needs a stored response; this server stores none (send the input whole)"),
            ));
        }
    }
    // `text.format` is chat's `response_format`, its json_schema flattened into it.
    let response_format = match body.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => None,
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("json_schema") => {
                let mut spec = format.clone();
                if let Value::Object(o) = &mut spec {
                    o.remove("type");
                }
                Some(json!({"type": "json_schema", "json_schema": spec}))
            }
            _ => Some(format.clone()),
        },
    };
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(invalid("instructions", "instructions must be a string")),
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let next = message(item, i)?;
                // The calls of one model turn are one item each; chat has them in one
                // assistant message, which their outputs answer.
                match (messages.last_mut(), next.get("tool_calls")) {
                    (Some(last), Some(Value::Array(calls))) if last["role"] == "assistant" => {
                        let merged = last.as_object_mut().expect("messages are objects");
                        match merged.get_mut("tool_calls") {
                            Some(Value::Array(earlier)) => earlier.extend(calls.iter().cloned()),
                            _ => {
                                merged.insert("tool_calls".into(), Value::Array(calls.clone()));
                            }
                        }
                    }
                    _ => messages.push(next),
                }
            }
        }
        _ => {
            return Err(invalid(
                "input",
                "input must be a string or a list of input items",
            ))
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(format) = response_format {
        chat.insert("response_format".into(), format);
    }
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = body.get("tool_choice").filter(|c| !c.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("stream", "stream"),
        ("needle", "needle"),
    ] {
        if let Some(v) = body.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    Ok(Value::Object(chat))
}

/// An input item as a chat message: a message of text, a call the model made (an
/// assistant message with that tool call) or a call's output (a tool message), or a
/// refusal naming what it is.
fn message(item: &Value, i: usize) -> Result<Value, Invalid> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let field = |name: &str| item.get(name).cloned().unwrap_or(Value::Null);
    match kind {
        "message" => {}
        "function_call" => {
            return Ok(json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": field("call_id"),
                    "type": "function",
                    "function": {"name": field("name"), "arguments": field("arguments")},
                }],
            }))
        }
        "function_call_output" => {
            let output = match field("output") {
                Value::String(text) => Value::String(text),
                other => Value::String(other.to_string()),
            };
            return Ok(json!({"role": "tool", "tool_call_id": field("call_id"), "content": output}));
        }
        other => {
            return Err(invalid(
                "input",
                format!("input[{i}]: {other} items are not supported (messages, function calls and their outputs are)"),
            ))
        }
    }
    let role = item.get("role").cloned().unwrap_or(Value::Null);
    let content = match item.get("content") {
        Some(Value::Array(parts)) => {
            let parts: Result<Vec<Value>, Invalid> = parts
                .iter()
                .map(
                    |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (
                            Some("input_text" | "output_text" | "text"),
                            Some(t @ Value::String(_)),
                        ) => Ok(json!({"type": "text", "text": t})),
                        (kind, _) => Err(invalid(
                            "input",
                            format!(
                                "input[{i}]: only text content parts are supported, not {}",
                                kind.unwrap_or("an untyped part")
                            ),
                        )),
                    },
                )
                .collect();
            Value::Array(parts?)
        }
        Some(other) => other.clone(),
        None => Value::Null,
    };
    Ok(json!({"role": role, "content": content}))
}

/// Responses function tools (`{"type": "function", "name", "description", "parameters",
/// "strict"}`) in chat's form; `strict` needs nothing more, the grammar is always strict.
fn chat_tools(tools: &Value) -> Result<Value, Invalid> {
    let Value::Array(tools) = tools else {
        return Err(invalid("tools", "tools must be a list"));
    };
    let chat: Result<Vec<Value>, Invalid> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for key in ["name", "description", "parameters"] {
                    if let Some(v) = t.get(key) {
                        function.insert(key.into(), v.clone());
                    }
                }
                Ok(json!({"type": "function", "function": function}))
            }
            kind => Err(invalid(
                "tools",
                format!(
                    "tools[{i}]: only function tools are supported, not {}",
                    kind.unwrap_or("an untyped tool")
                ),
            )),
        })
        .collect();
    Ok(Value::Array(chat?))
}

fn chat_tool_choice(choice: &Value) -> Result<Value, Invalid> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        _ => match (
            choice.get("type").and_then(Value::as_str),
            choice.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            _ => Err(invalid(
                "tool_choice",
                "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": …}",
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::request::ToolChoice;

    #[test]
    fn an_agents_request_reads_as_its_chat_request() {
        let r = parse(&json!({
            "model": "needle-demo",
            "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Lights off"}]}],
            "include": [],
            "tools": [{"type": "function", "name": "set_lights", "description": "d", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "set_lights"},
            "max_output_tokens": 64,
            "stream": true,
        }))
        .unwrap();
        assert_eq!(r.query, "Lights off");
        assert_eq!(r.system.as_deref(), Some("Be brief."));
        assert_eq!(
            r.tools,
            vec![
                json!({"name": "set_lights", "description": "d", "parameters": {"type": "object"}})
            ]
        );
        assert_eq!(r.tool_choice, ToolChoice::Function("set_lights".into()));
        assert_eq!((r.max_tokens, r.stream), (Some(64), true));
        let tools = json!([{"type": "function", "name": "ping"}]);
        assert_eq!(
            parse(&json!({"input": "hi", "tools": tools}))
                .unwrap()
                .query,
            "hi"
        );
    }

    #[test]
    fn the_calls_of_one_turn_are_one_assistant_message() {
        let call = |id: &str| json!({"type": "function_call", "call_id": id, "name": "ping", "arguments": "{}"});
        let output =
            |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "ok"});
        let body = json!({"input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me."}]},
            call("a"), call("b"), output("a"), output("b"),
        ], "tools": [{"type": "function", "name": "ping"}]});
        let r = parse(&body).unwrap();
        assert_eq!(r.turns.len(), 2, "{:?}", r.turns);
    }

    #[test]
    fn what_cannot_be_expressed_is_refused_naming_the_field() {
        let user = json!({"role": "user", "content": "hi"});
        for (body, param) in [
            (
                json!({"input": [user, {"type": "function_call_output", "call_id": "c", "output": "ok"}]}),
                "input",
            ),
            (
                json!({"input": "hi", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "web_search"}]}),
                "tools",
            ),
            (
                json!({"input": "hi", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (
                json!({"input": "hi", "text": {"format": {"type": "json_schema"}}}),
                "text",
            ),
            (json!({"input": 3}), "input"),
        ] {
            let e = parse(&body).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        }
    }
}
