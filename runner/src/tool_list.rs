//! A query's tool list, in either form callers write it: Needle's flat
//! `{"name", "description", "parameters"}` (upstream's `tools.json`) or OpenAI's
//! `{"type": "function", "function": {…}}`. Both become the flat form, which the prompt
//! renders (upstream `render_example`, which was trained on it) and the grammar constrains.
//! One reader for `needle-run --tools`, `--batch` lines and `serve`'s `tools`, generic over
//! the JSON value so that the CLI keeps Python's reading (every digit of a large integer,
//! `Infinity`) and the server its `serde_json` one.

use crate::python_json::PyJson;
use serde_json::Value;
use std::fmt;

/// The few questions the reader asks of a JSON value.
pub trait JsonTree: Clone {
    fn member(&self, key: &str) -> Option<&Self>;
    fn text(&self) -> Option<&str>;
    fn is_object(&self) -> bool;
    fn is_null(&self) -> bool;
}

impl JsonTree for Value {
    fn member(&self, key: &str) -> Option<&Self> {
        self.get(key)
    }

    fn text(&self) -> Option<&str> {
        self.as_str()
    }

    fn is_object(&self) -> bool {
        self.is_object()
    }

    fn is_null(&self) -> bool {
        self.is_null()
    }
}

impl JsonTree for PyJson {
    /// A repeated key holds its last value (Python's `dict`), which `loads` already kept.
    fn member(&self, key: &str) -> Option<&Self> {
        match self {
            PyJson::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            PyJson::Str(s) => Some(s),
            _ => None,
        }
    }

    fn is_object(&self) -> bool {
        matches!(self, PyJson::Object(_))
    }

    fn is_null(&self) -> bool {
        matches!(self, PyJson::Null)
    }
}

/// Why a tool list cannot be used: which tool, and what is wrong with it.
#[derive(Debug, PartialEq)]
pub struct ToolListError {
    pub index: usize,
    pub problem: String,
}

impl fmt::Display for ToolListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tools[{}]: {}", self.index, self.problem)
    }
}

impl std::error::Error for ToolListError {}

/// The tools of `list` in the flat form, in order: each OpenAI-form tool's `function`
/// object, each flat one as it is. Every tool needs a non-empty name, no name may repeat
/// (a call could not say which tool it means), and `parameters`, when given, is a JSON
/// schema object.
pub fn declared_tools<J: JsonTree>(list: &[J]) -> Result<Vec<J>, ToolListError> {
    let mut names: Vec<&str> = Vec::with_capacity(list.len());
    let mut flat = Vec::with_capacity(list.len());
    for (index, tool) in list.iter().enumerate() {
        let fail = |problem: String| ToolListError { index, problem };
        let function = match tool.member("type") {
            None => tool,
            Some(kind) => match (kind.text(), tool.member("function")) {
                (Some("function"), Some(f)) if f.is_object() => f,
                _ => {
                    return Err(fail(
                        "not {\"type\": \"function\", \"function\": {…}} (OpenAI's form) \
                         or {\"name\": …} (Needle's)"
                            .into(),
                    ))
                }
            },
        };
        if !function.is_object() {
            return Err(fail("a tool must be a JSON object".into()));
        }
        let name = function
            .member("name")
            .and_then(J::text)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| fail("no string \"name\"".into()))?;
        if names.contains(&name) {
            return Err(fail(format!("{name:?} is declared twice")));
        }
        names.push(name);
        if let Some(p) = function.member("parameters") {
            if !p.is_null() && !p.is_object() {
                return Err(fail("\"parameters\" must be a JSON schema object".into()));
            }
        }
        flat.push(function.clone());
    }
    Ok(flat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python_json::loads;
    use serde_json::json;

    #[test]
    fn both_forms_become_the_flat_one_in_either_json_reading() {
        let text = r#"[{"type": "function", "function": {"name": "a", "parameters": {"n": 123456789012345678901234567890}}},
                       {"name": "b", "description": "flat"}]"#;
        let Ok(PyJson::Array(list)) = loads(text) else {
            panic!("the list reads")
        };
        let flat = declared_tools(&list).unwrap();
        assert_eq!(
            PyJson::Array(flat).dumps_compact(),
            r#"[{"name":"a","parameters":{"n":123456789012345678901234567890}},{"name":"b","description":"flat"}]"#
        );
        let list = vec![
            json!({"type": "function", "function": {"name": "a"}}),
            json!({"name": "b"}),
        ];
        assert_eq!(
            declared_tools(&list).unwrap(),
            vec![json!({"name": "a"}), json!({"name": "b"})]
        );
    }

    #[test]
    fn a_tool_the_prompt_cannot_name_is_refused_with_its_index() {
        let cases = [
            (json!([{"description": "x"}]), 0, "name"),
            (json!([{"name": "a"}, {"name": ""}]), 1, "name"),
            (
                json!([{"name": "a"}, {"type": "function", "function": {"name": "a"}}]),
                1,
                "twice",
            ),
            (json!([{"type": "retrieval"}]), 0, "OpenAI's form"),
            (
                json!([{"type": "function", "function": "f"}]),
                0,
                "OpenAI's form",
            ),
            (json!(["f"]), 0, "object"),
            (json!([{"name": "a", "parameters": []}]), 0, "schema"),
        ];
        for (list, index, says) in cases {
            let e = declared_tools(list.as_array().unwrap()).unwrap_err();
            assert_eq!(e.index, index, "{list}: {e}");
            assert!(e.problem.contains(says), "{list}: {e}");
        }
    }
}
