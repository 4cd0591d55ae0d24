"""Validates tool-mode answers against their declared tools, independent of our Rust code.

Usage: validate_calls.py ANSWERS.jsonl

Each line is {"tools": [...], "answer": <needle-run's tool-mode JSON>}. An answer is valid
when its `<tool_call>` block parsed (`success`) and every call is an object with exactly
"name" and "arguments", names a declared tool (Needle's flat form or OpenAI's
{"type": "function", "function": {...}}), and its arguments validate (jsonschema,
Draft 2020-12) against the tool's parameters with every object schema closed to its
declared properties (argument keys must be declared). Prints one JSON line:
{"total": N, "valid": M, "invalid": [[line, reason], ...]}.
"""
import copy
import json
import sys

from jsonschema import Draft202012Validator


def parameters(tool):
    if tool.get("type") == "function" and "function" in tool:
        tool = tool["function"]
    params = tool.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    elif "type" not in params and "properties" not in params:
        params = {"type": "object", "properties": params}
    return tool["name"], params


def closed(schema):
    if isinstance(schema, dict):
        schema = dict(schema)
        if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for key in ("properties", "$defs", "definitions", "patternProperties"):
            if isinstance(schema.get(key), dict):
                schema[key] = {k: closed(v) for k, v in schema[key].items()}
        for key in ("items", "additionalProperties", "not"):
            if key in schema:
                schema[key] = closed(schema[key])
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if isinstance(schema.get(key), list):
                schema[key] = [closed(s) for s in schema[key]]
    return schema


def problem(tools, answer):
    if not answer.get("success"):
        return f"no parsed <tool_call> list: {answer.get('error')}"
    declared = dict(parameters(t) for t in tools)
    for call in answer["function_calls"]:
        if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
            return f"not a {{name, arguments}} object: {call}"
        if call["name"] not in declared:
            return f"undeclared tool {call['name']!r}"
        errors = list(Draft202012Validator(closed(copy.deepcopy(declared[call["name"]]))).iter_errors(call["arguments"]))
        if errors:
            return f"{call['name']}: {errors[0].message}"
    return None


def main(path):
    total, invalid = 0, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            total += 1
            reason = problem(row["tools"], row["answer"])
            if reason:
                invalid.append([number, reason])
    print(json.dumps({"total": total, "valid": total - len(invalid), "invalid": invalid}))


if __name__ == "__main__":
    main(sys.argv[1])
