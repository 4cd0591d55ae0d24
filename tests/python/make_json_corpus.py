"""A generated corpus of JSON texts and what upstream's Python makes of them.

Writes one JSON line per text to stdout: {"text": T, "dumps": D}, where D is
`json.dumps(json.loads(T), separators=(",", ":"), ensure_ascii=False)` (how upstream
`render_example` writes a tool list into the prompt), or null when `json.loads` refuses T
or the result cannot be encoded as UTF-8 (a lone surrogate). The texts are written
token by token, not by `json.dumps`, so that they carry what real files carry: integers
beyond 64 bits, exponents past float range (`1E400`), `-0`, `NaN`/`Infinity`, every escape,
surrogate pairs, raw Unicode, odd whitespace, repeated keys, deep nesting, and a share of
damaged texts. Deterministic for a seed.

Usage: python make_json_corpus.py [COUNT] [SEED]
"""
import json
import random
import sys

WHITESPACE = ["", "", "", " ", "\n", "\t", "\r\n", "  "]
RAW_CHARS = "aZ09 _-/'é漢字🙂\u2028\u00a0\u007f~<>{}[]:,"
ESCAPES = ['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u00e9", "\\u0000",
           "\\u001f", "\\uD83D\\uDE42", "\\ud83d\\ude00", "\\u2028", "\\uFFFF", "\\u0041"]


def ws(r):
    return r.choice(WHITESPACE)


def integer(r):
    kind = r.randrange(6)
    if kind == 0:
        return r.choice(["0", "-0", "1", "-1"])
    if kind == 1:
        return str(r.choice([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1]))
    digits = r.randrange(1, 60) if kind < 4 else r.randrange(1, 20)
    first = r.choice("123456789")
    rest = "".join(r.choice("0123456789") for _ in range(digits - 1))
    return r.choice(["", "-"]) + first + rest


def number(r):
    mantissa = integer(r)
    if r.random() < 0.5:
        mantissa += "." + "".join(r.choice("0123456789") for _ in range(r.randrange(1, 20)))
    if r.random() < 0.5:
        exp = r.choice([r.randrange(0, 30), r.randrange(280, 330), r.randrange(300, 1000)])
        mantissa += r.choice("eE") + r.choice(["", "+", "-"]) + str(exp)
    return mantissa


def string(r):
    parts = []
    for _ in range(r.randrange(0, 8)):
        parts.append(r.choice(ESCAPES) if r.random() < 0.4 else r.choice(RAW_CHARS))
    return '"' + "".join(parts) + '"'


def value(r, depth):
    kind = r.randrange(10 if depth < 6 else 6)
    if kind == 0:
        return r.choice(["null", "true", "false", "NaN", "Infinity", "-Infinity"])
    if kind in (1, 2):
        return number(r)
    if kind == 3:
        return integer(r)
    if kind in (4, 5):
        return string(r)
    if kind in (6, 7):
        items = [ws(r) + value(r, depth + 1) + ws(r) for _ in range(r.randrange(0, 5))]
        return "[" + ",".join(items) + ws(r) + "]"
    keys = [string(r) for _ in range(r.randrange(0, 5))]
    keys += r.sample(keys, min(len(keys), r.randrange(0, 2)))  # repeated keys
    members = [ws(r) + k + ws(r) + ":" + ws(r) + value(r, depth + 1) + ws(r) for k in keys]
    return "{" + ",".join(members) + ws(r) + "}"


def tool_list(r):
    tools = []
    for i in range(r.randrange(1, 4)):
        tools.append('{"name":"tool_%d","description":%s,"parameters":%s}'
                     % (i, string(r), value(r, 2)))
    return "[" + ",".join(tools) + "]"


def damage(r, text):
    at = r.randrange(len(text) + 1)
    return r.choice([
        lambda: text[:at],
        lambda: text[:at] + r.choice([",", "]", "}", ":", "01", "\x01", "\\x", "\\u12",
                                      "\\ud800", "nul", "+1", ".5", "1.", "-", "'a'"]) + text[at:],
        lambda: "\ufeff" + text,
        lambda: "[" * 2000 + "]" * 2000,
    ])()


def python_dumps(text):
    try:
        rendered = json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
        rendered.encode("utf-8")
        return rendered
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    r = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 13)
    for _ in range(count):
        text = ws(r) + (tool_list(r) if r.random() < 0.5 else value(r, 0)) + ws(r)
        if r.random() < 0.15:
            text = damage(r, text)
        print(json.dumps({"text": text, "dumps": python_dumps(text)}))


if __name__ == "__main__":
    main()
