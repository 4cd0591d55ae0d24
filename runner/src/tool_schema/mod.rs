//! A declared tool in the form Needle was trained on: `{name, description, parameters}`,
//! the schema with its keys in the trained order (`type`, `description`, `enum`,
//! `properties`, `items`, `required`, then the bounds) and without the keys schema
//! generators add that the training data never had (`title`, `additionalProperties`,
//! `$schema`, OpenAI's `strict`). Local `$ref`s (Pydantic's `$defs`) are written out where
//! they are used, a nullable schema (`Optional[X]`: `anyOf: [X, {"type": "null"}]`) is `X`
//! and not required (the trained form's optional), and a docstring description gives each
//! argument its text ([`docstring`]). A general transform of any JSON schema: it knows
//! keywords and docstring conventions, never tools.

mod docstring;

use serde_json::{Map, Value};

/// Keys in the order the trained schemas write them; any other key follows, as declared.
const KEY_ORDER: [&str; 12] = [
    "type",
    "description",
    "enum",
    "const",
    "properties",
    "items",
    "required",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "default",
];

/// Keys a schema generator adds that say nothing the model was trained to read.
const DROPPED: [&str; 6] = [
    "title",
    "additionalProperties",
    "$schema",
    "$defs",
    "definitions",
    "strict",
];

/// How deep `$ref`s are followed before one is left as it is (a recursive model).
const MAX_REF_DEPTH: usize = 8;

/// The tool `function` object (`{name, description?, parameters?, strict?, …}`) as the
/// trained prompts write tools.
pub fn trained_form(function: &Value) -> Value {
    let mut tool = Map::new();
    let name = function.get("name");
    if let Some(name) = name {
        tool.insert("name".into(), name.clone());
    }
    let described = match (name.and_then(Value::as_str), function.get("description")) {
        (Some(name), Some(Value::String(text))) => Some(docstring::split(name, text)),
        _ => None,
    };
    let description = match &described {
        Some(described) => Some(Value::from(described.summary.as_str())),
        None => function.get("description").cloned(),
    };
    if let Some(description) = description {
        tool.insert("description".into(), description);
    }
    if let Some(parameters) = function.get("parameters").filter(|p| !p.is_null()) {
        let mut parameters = parameters.clone();
        if let Some(described) = &described {
            describe_arguments(&mut parameters, &described.arguments);
        }
        let defs = Definitions::of(&parameters);
        let rendered = schema(&parameters, &defs, 0);
        tool.insert("parameters".into(), rendered);
    }
    Value::Object(tool)
}

/// Gives each top-level property without a description its docstring text.
fn describe_arguments(parameters: &mut Value, arguments: &[(String, String)]) {
    let Some(Value::Object(properties)) = parameters.get_mut("properties") else {
        return;
    };
    for (name, text) in arguments.iter().filter(|(_, text)| !text.is_empty()) {
        if let Some(Value::Object(property)) = properties.get_mut(name) {
            property
                .entry("description")
                .or_insert_with(|| text.clone().into());
        }
    }
}

/// `X` with the other keys of `object`, for a schema that says "`X` or null" (what
/// `Optional[X]` generates: `anyOf`/`oneOf` of `X` and `{"type": "null"}`, or `type:
/// [t, "null"]`), without a null `default`; None for any other schema.
fn without_null(object: &Map<String, Value>) -> Option<Map<String, Value>> {
    let is_null = |s: &Value| s.get("type").and_then(Value::as_str) == Some("null");
    let mut out = None;
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = object.get(key) {
            if let [a, b] = list.as_slice() {
                let inner = match (is_null(a), is_null(b)) {
                    (true, false) => b,
                    (false, true) => a,
                    _ => continue,
                };
                out = Some(beside(inner.as_object()?, object, key));
                break;
            }
        }
    }
    if out.is_none() {
        if let Some(Value::Array(types)) = object.get("type") {
            if let [a, b] = types.as_slice() {
                let kept = match (a == "null", b == "null") {
                    (true, false) => b,
                    (false, true) => a,
                    _ => return None,
                };
                let mut merged = object.clone();
                merged.insert("type".into(), kept.clone());
                out = Some(merged);
            }
        }
    }
    let mut out = out?;
    if out.get("default").is_some_and(Value::is_null) {
        out.remove("default");
    }
    Some(out)
}

/// The schema `inner` that `outer` points to by its key `by` (`$ref`, `anyOf`), with what
/// `outer` says beside it (a description, usually) taking precedence.
fn beside(inner: &Map<String, Value>, outer: &Map<String, Value>, by: &str) -> Map<String, Value> {
    let mut merged = inner.clone();
    for (k, v) in outer.iter().filter(|(k, _)| *k != by) {
        merged.insert(k.clone(), v.clone());
    }
    merged
}

/// The `$defs` (or `definitions`) of the root schema, which local `$ref`s name.
struct Definitions<'a> {
    root: &'a Value,
}

impl<'a> Definitions<'a> {
    fn of(root: &'a Value) -> Self {
        Definitions { root }
    }

    /// The schema `#/$defs/Name` (or `#/definitions/Name`) names, if the root has it.
    fn resolve(&self, reference: &str) -> Option<&'a Value> {
        let path = reference.strip_prefix("#/")?;
        let (section, name) = path.split_once('/')?;
        if !matches!(section, "$defs" | "definitions") {
            return None;
        }
        self.root.get(section)?.get(name)
    }
}

fn schema(value: &Value, defs: &Definitions<'_>, depth: usize) -> Value {
    let Value::Object(object) = value else {
        return value.clone();
    };
    if let Some(target) = object
        .get("$ref")
        .and_then(Value::as_str)
        .filter(|_| depth < MAX_REF_DEPTH)
        .and_then(|r| defs.resolve(r))
    {
        let merged = beside(
            &target.as_object().cloned().unwrap_or_default(),
            object,
            "$ref",
        );
        return schema(&Value::Object(merged), defs, depth + 1);
    }
    if let Some(non_null) = without_null(object) {
        return schema(&Value::Object(non_null), defs, depth);
    }
    // Properties that may be null may be left out: OpenAI's strict schemas require every
    // property and make the optional ones nullable, where the trained form omits them.
    let nullable: Vec<&str> = match object.get("properties") {
        Some(Value::Object(props)) => props
            .iter()
            .filter(|(_, s)| s.as_object().and_then(without_null).is_some())
            .map(|(name, _)| name.as_str())
            .collect(),
        _ => Vec::new(),
    };
    let mut out = Map::new();
    let keys = KEY_ORDER
        .iter()
        .copied()
        .filter(|k| object.contains_key(*k))
        .chain(
            object
                .keys()
                .map(String::as_str)
                .filter(|k| !KEY_ORDER.contains(k) && !DROPPED.contains(k)),
        );
    for key in keys {
        let v = &object[key];
        let v = match key {
            "properties" => match v {
                Value::Object(props) => Value::Object(
                    props
                        .iter()
                        .map(|(name, s)| (name.clone(), schema(s, defs, depth)))
                        .collect(),
                ),
                other => other.clone(),
            },
            "items" => schema(v, defs, depth),
            "required" => match v {
                Value::Array(names) => Value::Array(required(object, names, &nullable)),
                other => other.clone(),
            },
            "anyOf" | "oneOf" | "allOf" => match v {
                Value::Array(list) => {
                    Value::Array(list.iter().map(|s| schema(s, defs, depth)).collect())
                }
                other => other.clone(),
            },
            _ => v.clone(),
        };
        out.insert(key.to_string(), v);
    }
    Value::Object(out)
}

/// `required` without the nullable properties, in the properties' order (as the trained
/// schemas list it; instructor sorts it by name): names no property has stay, last.
fn required(object: &Map<String, Value>, names: &[Value], nullable: &[&str]) -> Vec<Value> {
    let order = |name: &Value| {
        object
            .get("properties")
            .and_then(Value::as_object)
            .and_then(|props| {
                name.as_str()
                    .and_then(|n| props.keys().position(|k| k == n))
            })
            .unwrap_or(usize::MAX)
    };
    let mut kept: Vec<Value> = names
        .iter()
        .filter(|n| !n.as_str().is_some_and(|n| nullable.contains(&n)))
        .cloned()
        .collect();
    kept.sort_by_key(order);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Keys in order, as the prompt writes them.
    fn text(v: &Value) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn a_pydantic_schema_takes_the_trained_order_and_loses_its_titles() {
        // What pydantic's model_json_schema() gives for a model with an enum field
        // and a nested model (not one of the demo's tools).
        let function = json!({
            "name": "book_flight",
            "description": "Book a flight.",
            "strict": true,
            "parameters": {
                "$defs": {
                    "Seat": {"title": "Seat", "type": "string", "enum": ["aisle", "window"]},
                    "Passenger": {
                        "properties": {"name": {"title": "Name", "type": "string"}},
                        "required": ["name"],
                        "title": "Passenger",
                        "type": "object",
                        "additionalProperties": false
                    }
                },
                "properties": {
                    "to": {"description": "IATA code.", "title": "To", "type": "string"},
                    "seat": {"$ref": "#/$defs/Seat", "description": "Seat kind."},
                    "who": {"items": {"$ref": "#/$defs/Passenger"}, "title": "Who", "type": "array"}
                },
                "required": ["to"],
                "title": "BookFlight",
                "type": "object",
                "additionalProperties": false
            }
        });
        let expected = json!({
            "name": "book_flight",
            "description": "Book a flight.",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "string", "description": "IATA code."},
                    "seat": {"type": "string", "description": "Seat kind.", "enum": ["aisle", "window"]},
                    "who": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}},
                            "required": ["name"]
                        }
                    }
                },
                "required": ["to"]
            }
        });
        assert_eq!(text(&trained_form(&function)), text(&expected));
    }

    #[test]
    fn a_schema_in_the_trained_form_is_unchanged() {
        let function = json!({
            "name": "convert",
            "description": "Convert an amount.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "description": "How much.", "minimum": 0},
                    "unit": {"type": "string", "enum": ["kg", "lb"], "format": "unit-name"}
                },
                "required": ["amount", "unit"]
            }
        });
        assert_eq!(text(&trained_form(&function)), text(&function));
    }

    #[test]
    fn a_recursive_reference_stops_unrolling() {
        let function = json!({
            "name": "tree",
            "parameters": {
                "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
                "type": "object",
                "properties": {"root": {"$ref": "#/$defs/Node"}}
            }
        });
        let out = text(&trained_form(&function));
        assert_eq!(out.matches("\"child\"").count(), MAX_REF_DEPTH, "{out}");
        assert_eq!(out.matches("$ref").count(), 1, "{out}");
    }

    #[test]
    fn optional_arguments_are_their_type_and_not_required() {
        // openai-agents' strict schema of `def book(to: str, seat: Optional[Seat] = None)`:
        // every property required, the optional ones nullable; and pydantic's own
        // `anyOf` with a null default, and a JSON-schema type list.
        let function = json!({
            "name": "book",
            "description": "Book a seat.",
            "parameters": {
                "$defs": {"Seat": {"enum": ["aisle", "window"], "title": "Seat", "type": "string"}},
                "properties": {
                    "to": {"title": "To", "type": "string"},
                    "seat": {"anyOf": [{"$ref": "#/$defs/Seat"}, {"type": "null"}], "description": "Where."},
                    "bags": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 0}], "default": null},
                    "note": {"type": ["string", "null"]},
                    "at": {"type": "string"}
                },
                "required": ["at", "bags", "note", "seat", "to"],
                "type": "object",
                "additionalProperties": false
            }
        });
        let expected = json!({
            "name": "book",
            "description": "Book a seat.",
            "parameters": {
                "type": "object",
                "properties": {
                    "to": {"type": "string"},
                    "seat": {"type": "string", "description": "Where.", "enum": ["aisle", "window"]},
                    "bags": {"type": "integer", "minimum": 0},
                    "note": {"type": "string"},
                    "at": {"type": "string"}
                },
                "required": ["to", "at"]
            }
        });
        assert_eq!(text(&trained_form(&function)), text(&expected));
    }

    #[test]
    fn a_docstring_description_gives_the_arguments_their_texts() {
        // LangChain's `@tool` of a Google-style docstring: the whole docstring as the
        // description, no property descriptions; one property says its own, which stays.
        let function = json!({
            "name": "find_book",
            "description": "Look up a book.\n\n    Args:\n        isbn: The ISBN-13.\n        shelf: Where to look.",
            "parameters": {
                "properties": {
                    "isbn": {"type": "string"},
                    "shelf": {"type": "string", "description": "Shelf code."}
                },
                "required": ["isbn"],
                "type": "object"
            }
        });
        let expected = json!({
            "name": "find_book",
            "description": "Look up a book.",
            "parameters": {
                "type": "object",
                "properties": {
                    "isbn": {"type": "string", "description": "The ISBN-13."},
                    "shelf": {"type": "string", "description": "Shelf code."}
                },
                "required": ["isbn"]
            }
        });
        assert_eq!(text(&trained_form(&function)), text(&expected));
    }

    #[test]
    fn a_tool_without_parameters_or_description_keeps_what_it_has() {
        let function = json!({"name": "ping", "parameters": null, "strict": false});
        assert_eq!(text(&trained_form(&function)), r#"{"name":"ping"}"#);
    }
}
