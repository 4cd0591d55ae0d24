//! An OpenAI chat-completions request read into what Needle's prompt can express:
//! system text, one user query, the tools, and how to decode. Anything it cannot honour is
//! refused with a message naming the field, never silently dropped.

use crate::constrain::CallCount;
use crate::conversation::{self, Conversation};
use crate::prompt::Turn;
use crate::serve::stop::StopTexts;
use crate::tool_list::declared_tools;
use crate::tool_schema::trained_form;
use serde_json::{json, Map, Value};

/// A request refused: the message and the field it is about (OpenAI's `param`).
#[derive(Debug, PartialEq)]
pub struct Invalid {
    pub message: String,
    pub param: Option<&'static str>,
}

fn invalid(param: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        message: message.into(),
        param: Some(param),
    }
}

/// How the answer may use the tools (`tool_choice`).
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The model decides (the default).
    Auto,
    /// No call: Needle's "respond" answer, an empty `<tool_call>` list (decoded under
    /// that grammar; Needle answers in calls, never in free text).
    None,
    /// At least one call of the declared tools (decoded under their grammar).
    Required,
    /// At least one call, of this tool only (decoded under its grammar).
    Function(String),
}

/// What a chat-completions request asks for.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    /// The tools in the form Needle was trained on (`tool_schema::trained_form`).
    pub tools: Vec<Value>,
    /// The first user message, the turn the tools are written in.
    pub query: String,
    /// What follows it: the assistant's turns, tool results, later user messages.
    pub turns: Vec<Turn>,
    pub system: Option<String>,
    pub tool_choice: ToolChoice,
    pub max_tokens: Option<usize>,
    /// 0 (the default) is greedy, as `needle-run` decodes.
    pub temperature: f32,
    pub seed: u64,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// `parallel_tool_calls` (default true); false allows one call at most, which only the
    /// grammar can hold the model to.
    pub parallel_tool_calls: bool,
    /// `stop`: the answer ends before the first of these in its decoded text.
    pub stop: StopTexts,
    /// `n`: answers to generate, each a row of the batch.
    pub n: usize,
    /// `logprobs: true`, with `top_logprobs` (0 to 20) alternatives per token.
    pub top_logprobs: Option<usize>,
    /// What the answer is: calls, or (`response_format` `json_schema`) one JSON value.
    pub form: AnswerForm,
}

/// What an answer is to the client.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AnswerForm {
    /// Needle's calls as `tool_calls` (and its text as `content`); with `declined_in_words`
    /// (the model was free not to call: `tool_choice` auto), an answer of no call and no
    /// text says its reasoning as `content` ([`crate::serve::shared::answer_in_form`]).
    Calls { declined_in_words: bool },
    /// `response_format` `json_schema`: decoded as upstream's `extract` does, as the one
    /// call of a tool whose parameters are the schema; its arguments are the `content`.
    Json,
}

impl ChatRequest {
    /// How many calls the grammar allows.
    pub fn call_count(&self) -> CallCount {
        CallCount {
            at_least: usize::from(matches!(
                self.tool_choice,
                ToolChoice::Required | ToolChoice::Function(_)
            )),
            at_most: (!self.parallel_tool_calls).then_some(1),
        }
    }

    /// The tools the grammar allows calls of.
    pub fn callable_tools(&self) -> Vec<Value> {
        match &self.tool_choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(name) => self
                .tools
                .iter()
                .filter(|t| tool_name(t) == Some(name))
                .cloned()
                .collect(),
            _ => self.tools.clone(),
        }
    }
}

fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("name").and_then(Value::as_str)
}

/// Reads the request body (already parsed as JSON).
pub fn parse(body: &Value) -> Result<ChatRequest, Invalid> {
    let Value::Object(body) = body else {
        return Err(Invalid {
            message: "the request body must be a JSON object".into(),
            param: None,
        });
    };
    refuse_unsupported(body)?;
    let Conversation {
        system,
        query,
        turns,
    } = messages(body.get("messages"))?;
    let mut tools = tools(body.get("tools"))?;
    let mut tool_choice = tool_choice(body.get("tool_choice"), &tools)?;
    let form = match schema_tool(body.get("response_format"))? {
        None => AnswerForm::Calls {
            declined_in_words: tool_choice == ToolChoice::Auto,
        },
        Some(_) if !tools.is_empty() => {
            return Err(invalid(
                "response_format",
                "a json_schema or json_object response_format is answered as the call of one \
                 tool whose parameters are the schema; send it without tools",
            ))
        }
        Some(tool) => {
            tool_choice = ToolChoice::Function(tool_name(&tool).unwrap_or_default().to_string());
            tools = vec![tool];
            AnswerForm::Json
        }
    };
    let max_tokens = match (body.get("max_completion_tokens"), body.get("max_tokens")) {
        (Some(v), _) if !v.is_null() => Some(positive(v, "max_completion_tokens")?),
        (_, Some(v)) if !v.is_null() => Some(positive(v, "max_tokens")?),
        _ => None,
    };
    let temperature = match body.get("temperature") {
        None | Some(Value::Null) => 0.0,
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && (0.0..=2.0).contains(&t) => t as f32,
            _ => {
                return Err(invalid(
                    "temperature",
                    "temperature must be a number from 0 to 2",
                ))
            }
        },
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .map(|s| s as u64)
            .or_else(|| v.as_u64())
            .ok_or_else(|| invalid("seed", "seed must be an integer"))?,
    };
    let stream = flag(body.get("stream"), "stream", false)?;
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => flag(o.get("include_usage"), "stream_options", false)?,
        Some(_) => {
            return Err(invalid(
                "stream_options",
                "stream_options must be an object",
            ))
        }
    };
    // Every answer is decoded under the declared tools' grammar, so a call names only a
    // declared tool and a runaway answer is closed within its budget; `needle.constrain`
    // (`true`) is accepted as before.
    match body.get("needle") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            if let Some(key) = o.keys().find(|k| *k != "constrain") {
                return Err(invalid(
                    "needle",
                    format!("needle.{key} is not a needle option (only needle.constrain)"),
                ));
            }
            if !flag(o.get("constrain"), "needle", true)? {
                return Err(invalid(
                    "needle",
                    "needle.constrain false is not served: the server always decodes under \
                     the declared tools' grammar (needle-run decodes freely without --constrain)",
                ));
            }
        }
        Some(_) => {
            return Err(invalid(
                "needle",
                "needle must be an object, e.g. {\"constrain\": true}",
            ))
        }
    }
    // A structured answer is one value: one call.
    let parallel_tool_calls = flag(body.get("parallel_tool_calls"), "parallel_tool_calls", true)?
        && matches!(form, AnswerForm::Calls { .. });
    let stop = stop_texts(body.get("stop"))?;
    let n = match body.get("n") {
        None | Some(Value::Null) => 1,
        Some(v) => positive(v, "n")?,
    };
    let top_logprobs = top_logprobs(body)?;
    if tools.is_empty() {
        // Needle has no free-text answer: without tools it could only say "respond", an
        // empty answer after the whole budget of reasoning.
        return Err(invalid(
            "tools",
            "Needle answers by calling the request's tools and this request declares none \
             (for plain text continuation use needle-run --raw)",
        ));
    }
    Ok(ChatRequest {
        tools,
        query,
        turns,
        system,
        tool_choice,
        max_tokens,
        temperature,
        seed,
        stream,
        include_usage,
        parallel_tool_calls,
        stop,
        n,
        top_logprobs,
        form,
    })
}

/// `response_format` `json_schema` as the tool whose one call answers it (upstream's
/// `needle.extract(text, schema)`: the schema is the only tool's parameters), in the
/// trained form; `json_object` as such a tool whose parameters are any object; `None` for
/// text answers.
fn schema_tool(format: Option<&Value>) -> Result<Option<Value>, Invalid> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_schema") => {
            let spec = format.get("json_schema").ok_or_else(|| {
                invalid(
                    "response_format",
                    "response_format json_schema needs json_schema",
                )
            })?;
            let name = spec
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid("response_format", "json_schema needs a name"))?;
            let schema = match spec.get("schema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                _ => {
                    return Err(invalid(
                        "response_format",
                        "json_schema.schema must be a JSON schema object",
                    ))
                }
            };
            let mut function = json!({"name": name, "parameters": schema});
            if let Some(description) = spec.get("description").filter(|d| d.is_string()) {
                function["description"] = description.clone();
            }
            Ok(Some(trained_form(&function)))
        }
        // Any object: the grammar closes objects only where a schema does not say otherwise,
        // so the open `additionalProperties` stays in what is decoded (and rendered, being
        // what the answer may be).
        Some("json_object") => Ok(Some(json!({
            "name": "json_object",
            "description": "Answers with one JSON object.",
            "parameters": {"type": "object", "additionalProperties": true},
        }))),
        Some(other) => Err(invalid(
            "response_format",
            format!("response_format {other:?} is not supported"),
        )),
    }
}

/// `logprobs` and `top_logprobs` together: `Some(k)` when log-probabilities are asked for.
fn top_logprobs(body: &Map<String, Value>) -> Result<Option<usize>, Invalid> {
    let wanted = flag(body.get("logprobs"), "logprobs", false)?;
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k <= 20 => Some(k as usize),
            _ => {
                return Err(invalid(
                    "top_logprobs",
                    "top_logprobs must be an integer from 0 to 20",
                ))
            }
        },
    };
    match (wanted, top) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, None) => Ok(None),
        (false, Some(_)) => Err(invalid("top_logprobs", "top_logprobs needs logprobs: true")),
    }
}

/// `stop`: a string or a list of up to 4, none empty (an empty one would stop at once).
fn stop_texts(stop: Option<&Value>) -> Result<StopTexts, Invalid> {
    let shape = || invalid("stop", "stop must be a string or a list of up to 4 strings");
    let list: Vec<String> = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).ok_or_else(shape))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(shape()),
    };
    if list.len() > 4 {
        return Err(invalid(
            "stop",
            format!("stop has {} sequences; at most 4", list.len()),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(invalid("stop", "a stop sequence must not be empty"));
    }
    Ok(StopTexts(list))
}

/// Fields whose meaning this server cannot honour.
fn refuse_unsupported(body: &Map<String, Value>) -> Result<(), Invalid> {
    if body.contains_key("functions") || body.contains_key("function_call") {
        return Err(invalid("functions", "the deprecated functions/function_call fields are not supported; use tools/tool_choice"));
    }
    Ok(())
}

/// Needle's prompt (upstream `render_example`) has an optional system turn and one user
/// turn: system and developer messages become the system text, and the last message must
/// be the one user message.
fn messages(messages: Option<&Value>) -> Result<Conversation, Invalid> {
    let Some(Value::Array(messages)) = messages else {
        return Err(invalid("messages", "messages must be a list of messages"));
    };
    conversation::read(messages).map_err(|e| invalid("messages", e))
}

/// The tools in Needle's flat form ([`declared_tools`]: OpenAI's
/// `[{"type": "function", "function": {name, description, parameters}}]`, each tool its
/// `function` object), rewritten in the form Needle was trained on ([`trained_form`]).
fn tools(tools: Option<&Value>) -> Result<Vec<Value>, Invalid> {
    match tools {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => declared_tools(list)
            .map(|tools| tools.iter().map(trained_form).collect())
            .map_err(|e| invalid("tools", e.to_string())),
        Some(_) => Err(invalid("tools", "tools must be a list")),
    }
}

fn tool_choice(choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoice, Invalid> {
    let choice = match choice {
        None | Some(Value::Null) => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(invalid("tool_choice", format!("tool_choice {other:?} is not auto, none, required or a function"))),
        },
        Some(v) => match (v.get("type").and_then(Value::as_str), v.pointer("/function/name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => ToolChoice::Function(name.to_string()),
            _ => return Err(invalid("tool_choice", "tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": …}}")),
        },
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(invalid(
            "tool_choice",
            "tool_choice required needs at least one tool",
        )),
        ToolChoice::Function(name) if !tools.iter().any(|t| tool_name(t) == Some(name)) => {
            Err(invalid(
                "tool_choice",
                format!("tool_choice names {name:?}, which is not one of the tools"),
            ))
        }
        _ => Ok(choice),
    }
}

fn positive(v: &Value, param: &'static str) -> Result<usize, Invalid> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n as usize),
        _ => Err(invalid(
            param,
            format!("{param} must be a positive integer"),
        )),
    }
}

/// A true/false field, `absent` when the request leaves it out.
fn flag(v: Option<&Value>, param: &'static str, absent: bool) -> Result<bool, Invalid> {
    match v {
        None | Some(Value::Null) => Ok(absent),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(param, format!("{param} must be true or false"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn a_tool_request_becomes_the_query_the_system_text_and_flat_tools() {
        let r = parse(&json!({
            "model": "m",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
            "tools": [weather()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 64,
        }))
        .unwrap();
        assert_eq!(r.query, "Weather in Paris?");
        assert_eq!(r.system.as_deref(), Some("Be brief."));
        assert_eq!(r.tools, vec![weather()["function"].clone()]);
        assert_eq!(r.tool_choice, ToolChoice::Function("get_weather".into()));
        assert_eq!((r.max_tokens, r.temperature), (Some(64), 0.0));
    }

    #[test]
    fn what_the_prompt_cannot_express_is_refused_naming_the_field() {
        let user = json!({"role": "user", "content": "hi"});
        let cases = [
            (
                json!({"messages": [user, {"role": "assistant", "content": "x"}]}),
                "messages",
            ),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [user], "n": 0}), "n"),
            (
                json!({"messages": [user], "top_logprobs": 3}),
                "top_logprobs",
            ),
            (
                json!({"messages": [user], "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"messages": [user], "stop": ["a", "b", "c", "d", "e"]}),
                "stop",
            ),
            (json!({"messages": [user], "stop": [""]}), "stop"),
            (json!({"messages": [user], "stop": 3}), "stop"),
            (
                json!({"messages": [user], "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "tools": [weather(), weather()]}),
                "tools",
            ),
            (json!({"messages": [user], "max_tokens": 0}), "max_tokens"),
            (
                json!({"messages": [user], "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"messages": [user], "needle": {"constrian": true}}),
                "needle",
            ),
            (
                json!({"messages": [user], "parallel_tool_calls": "no"}),
                "parallel_tool_calls",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages",
            ),
            // Needle answers only in calls of declared tools, always under their grammar.
            (json!({"messages": [user]}), "tools"),
            (
                json!({"messages": [user], "tools": [weather()], "needle": {"constrain": false}}),
                "needle",
            ),
        ];
        for (body, param) in cases {
            let e = parse(&body).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        }
    }
}
