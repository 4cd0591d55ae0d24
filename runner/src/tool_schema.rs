//! A declared tool in the form Needle was trained on: `{name, description, parameters}`,
//! the schema with its keys in the trained order (`type`, `description`, `enum`,
//! `properties`, `items`, `required`, then the bounds) and without the keys schema
//! generators add that the training data never had (`title`, `additionalProperties`,
//! `$schema`, OpenAI's `strict`). Local `$ref`s (Pydantic's `$defs`) are written out where
//! they are used. A general transform of any JSON schema: it knows keywords, never tools.

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
    for key in ["name", "description"] {
        if let Some(v) = function.get(key) {
            tool.insert(key.to_string(), v.clone());
        }
    }
    if let Some(parameters) = function.get("parameters").filter(|p| !p.is_null()) {
        let defs = Definitions::of(parameters);
        tool.insert("parameters".into(), schema(parameters, &defs, 0));
    }
    Value::Object(tool)
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
        // The referenced schema, with what the referring one says beside `$ref` (a
        // description, usually) taking precedence.
        let mut merged = target.as_object().cloned().unwrap_or_default();
        for (k, v) in object.iter().filter(|(k, _)| *k != "$ref") {
            merged.insert(k.clone(), v.clone());
        }
        return schema(&Value::Object(merged), defs, depth + 1);
    }
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
    fn a_tool_without_parameters_or_description_keeps_what_it_has() {
        let function = json!({"name": "ping", "parameters": null, "strict": false});
        assert_eq!(text(&trained_form(&function)), r#"{"name":"ping"}"#);
    }
}
