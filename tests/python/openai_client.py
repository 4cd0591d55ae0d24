"""The official `openai` client against `needle-run serve` (runner/tests/serve.rs runs it).

Reads {"base_url", "scenario", ...} as JSON on stdin and prints what the client got as JSON
on stdout: the judging is the Rust test's, against one-at-a-time `needle-run` answers.
The client is used as an application would (max_retries=0 so that refusals are seen);
raw HTTP only where the client cannot send the request (a body that is not JSON).
"""

import concurrent.futures
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families


def openai_tools(tools):
    return [{"type": "function", "function": t} for t in tools]


def logprobs_of(logprobs):
    """A choice's `logprobs.content` as plain lists; None when there are none."""
    if logprobs is None or logprobs.content is None:
        return None
    return [
        {
            "token": t.token,
            "bytes": t.bytes,
            "logprob": t.logprob,
            "top": [{"token": a.token, "bytes": a.bytes, "logprob": a.logprob} for a in t.top_logprobs],
        }
        for t in logprobs.content
    ]


def choice_of(choice):
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)}
        for c in (choice.message.tool_calls or [])
    ]
    return {
        "index": choice.index,
        "content": choice.message.content,
        "tool_calls": calls,
        "finish_reason": choice.finish_reason,
        "logprobs": logprobs_of(choice.logprobs),
        "needle": (choice.model_extra or {}).get("needle"),
    }


def message_of(completion):
    """The first choice, the usage and Needle's extras."""
    return {
        **choice_of(completion.choices[0]),
        "usage": completion.usage.model_dump() if completion.usage else None,
        "needle": (completion.model_extra or {}).get("needle"),
        "choices": [choice_of(c) for c in completion.choices],
    }


def after_tools(q, calls):
    """`q`'s conversation after its answer's `calls` (as `choice_of` has them) ran, each
    tool's output `{"ok": true}`."""
    return [
        {"role": "user", "content": q["query"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in calls
            ],
        },
    ] + [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": True})} for c in calls]


def ask(client, q, **kw):
    return client.chat.completions.create(
        model="needle-demo",
        messages=[{"role": "user", "content": q["query"]}],
        tools=openai_tools(q["tools"]),
        **kw,
    )


def parsed_or_raw(arguments):
    """Streamed arguments as JSON, or {"unparsed": text} when the answer ended inside them
    (a stop sequence, max_tokens), as OpenAI's streams can end."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return {"unparsed": arguments}


def streamed(client, q, **kw):
    """A stream put together as a client does, choice by choice: the first choice's at the
    top, every choice under "choices"."""
    choices, usage, chunks = {}, None, 0
    for chunk in ask(client, q, stream=True, stream_options={"include_usage": True}, **kw):
        chunks += 1
        if chunk.usage:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            got = choices.setdefault(
                choice.index,
                {"content": "", "reasoning": "", "calls": {}, "finish_reason": None, "needle": None, "logprobs": None},
            )
            got["needle"] = (chunk.model_extra or {}).get("needle", got["needle"])
            delta = choice.delta
            got["content"] += delta.content or ""
            got["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
            for c in delta.tool_calls or []:
                first = c.index not in got["calls"]
                call = got["calls"].setdefault(c.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
                if first:
                    call["announced"] = {"id": c.id, "type": c.type, "name": c.function.name}
                call["id"] = c.id or call["id"]
                call["name"] += c.function.name or ""
                call["arguments"] += c.function.arguments or ""
                call["pieces"] += bool(c.function.arguments)
            got["finish_reason"] = choice.finish_reason or got["finish_reason"]
            entries = logprobs_of(choice.logprobs)
            if entries is not None:
                got["logprobs"] = (got["logprobs"] or []) + entries
    assembled = []
    for index, got in sorted(choices.items()):
        calls = got.pop("calls")
        got["tool_calls"] = [
            {"id": c["id"], "name": c["name"], "arguments": parsed_or_raw(c["arguments"])}
            for _, c in sorted(calls.items())
        ]
        got["call_streams"] = [
            {"announced": c["announced"], "pieces": c["pieces"]} for _, c in sorted(calls.items())
        ]
        got["index"] = index
        assembled.append(got)
    return {**assembled[0], "usage": usage, "chunks": chunks, "choices": assembled}


def refusal(call):
    """The status and error object of a request the server must refuse."""
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {
            "status": e.status_code,
            "message": body.get("message"),
            "param": body.get("param"),
            "code": body.get("code"),
            "type": body.get("type"),
            "exception": type(e).__name__,
        }
    return {"status": 200}


def raw_post(base_url, data, content_type="application/json"):
    req = urllib.request.Request(base_url + "/chat/completions", data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return {"status": r.status, "error": None}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": json.loads(e.read() or b"{}").get("error")}


def raw_get(url, headers=None):
    """A GET outside the client: its status, content type and body text."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return {"status": r.status, "content_type": r.headers.get("Content-Type"), "text": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "content_type": e.headers.get("Content-Type"), "text": e.read().decode()}


def refused_on_one_connection(spec, path="/v1/chat/completions", times=3):
    """Status lines of `times` keyless POSTs to `path` on one kept-alive connection, each
    body sent a moment after its headers, as clients that write them separately do; a
    server that answers before reading the body and then drops the connection fails the
    second request (the way the `openai` client saw "server disconnected")."""
    host, port = root(spec).removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: needle\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    lines = []
    with socket.create_connection((host, int(port)), timeout=30) as s:
        for _ in range(times):
            try:
                s.sendall(head)
                time.sleep(0.05)
                s.sendall(body)
                reply = s.recv(65536)
                lines.append(reply.split(b"\r\n")[0].decode() if reply else "closed")
            except OSError as e:
                lines.append(type(e).__name__)
    return lines


def root(spec):
    return spec["base_url"].removesuffix("/v1")


def scrape(spec, headers=None):
    """/metrics as prometheus_client's parser reads it: {"name{label=value,...}": value}."""
    got = raw_get(root(spec) + "/metrics", headers)
    assert got["status"] == 200, got
    samples = {}
    for family in text_string_to_metric_families(got["text"]):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return {"content_type": got["content_type"], "samples": samples}


def answers(spec):
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    queries = spec["queries"]
    q = queries[0]
    first_tool = q["tools"][0]["name"]
    out = {
        "models": [m.id for m in client.models.list()],
        "tool_call": message_of(ask(client, q)),
        "constrained": message_of(ask(client, q, extra_body={"needle": {"constrain": True}})),
        "stream": streamed(client, q),
        "none": message_of(ask(client, q, tool_choice="none")),
        "required": message_of(ask(client, q, tool_choice="required")),
        "named": message_of(ask(client, q, tool_choice={"type": "function", "function": {"name": first_tool}})),
        "named_tool": first_tool,
        "one_call": message_of(ask(client, q, parallel_tool_calls=False)),
        "system": message_of(
            client.chat.completions.create(
                model="needle-demo",
                messages=[{"role": "system", "content": spec["system"]}, {"role": "user", "content": q["query"]}],
                tools=openai_tools(q["tools"]),
            )
        ),
    }
    with concurrent.futures.ThreadPoolExecutor(len(queries)) as pool:
        out["concurrent"] = list(pool.map(lambda q: message_of(ask(client, q)), queries))
    user = [{"role": "user", "content": q["query"]}]
    # The tool loop: the call goes back with each tool's output, and the model answers.
    out["continued"] = message_of(
        client.chat.completions.create(
            model="needle-demo", messages=after_tools(q, out["tool_call"]["tool_calls"]), tools=openai_tools(q["tools"])
        )
    )
    out["bad"] = {
        "not_json": raw_post(client.base_url.__str__().rstrip("/"), b"{not json"),
        "no_messages": refusal(lambda: client.chat.completions.create(model="needle-demo", messages=[])),
        "ends_with_assistant": refusal(
            lambda: client.chat.completions.create(
                model="needle-demo", messages=user + [{"role": "assistant", "content": "ok"}], tools=openai_tools(q["tools"])
            )
        ),
        "unknown_function": refusal(
            lambda: ask(client, q, tool_choice={"type": "function", "function": {"name": "no_such_tool"}})
        ),
        "n_past_batch": refusal(lambda: ask(client, q, n=17)),
        "bad_temperature": refusal(lambda: ask(client, q, temperature=7)),
        "too_long": refusal(lambda: ask(client, {"query": "lights " * 1200, "tools": q["tools"]})),
        "no_tools": refusal(lambda: client.chat.completions.create(model="needle-demo", messages=user)),
        "free_decoding": refusal(lambda: ask(client, q, extra_body={"needle": {"constrain": False}})),
    }
    out["health_after"] = json.loads(urllib.request.urlopen(spec["base_url"].removesuffix("/v1") + "/health").read())
    return out


def limits(spec):
    """A server run with --max-batch 1 --queue 1 --max-body 4096."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    q = {"query": spec["queries"][0]["query"], "tools": spec["queries"][0]["tools"][:1]}
    long_answer = dict(temperature=2.0, seed=7, max_tokens=260)
    burst = [None] * 12
    barrier = threading.Barrier(len(burst))

    def one(i):
        barrier.wait()
        burst[i] = refusal(lambda: ask(client, q, **long_answer))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(burst))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "burst": burst,
        "too_large": raw_post(spec["base_url"], json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()),
        "quick_after": message_of(ask(client, q, max_tokens=4)),
    }


def timeout(spec):
    """A server run with a --request-timeout shorter than any prefill."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    return {"timeout": refusal(lambda: ask(client, spec["queries"][0]))}


def drain(spec):
    """SIGTERM while a streamed answer is being generated: it must still finish."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    q = spec["queries"][0]
    stream = ask(client, q, stream=True, temperature=2.0, seed=3, max_tokens=200)
    chunks, finish = 0, None
    for chunk in stream:
        chunks += 1
        if chunks == 2:
            os.kill(spec["pid"], signal.SIGTERM)
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
    try:
        urllib.request.urlopen(spec["base_url"].removesuffix("/v1") + "/health", timeout=5)
        after = "answered"
    except (urllib.error.URLError, ConnectionError):
        after = "refused"
    return {"chunks": chunks, "finish_reason": finish, "after": after}


def models_and_metrics(spec):
    """GET /v1/models/{id}, unknown model names, and /metrics before, during and after
    requests (a server run with --max-batch 2)."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    q = spec["queries"][0]
    before = scrape(spec)
    retrieved = client.models.retrieve("needle-demo")
    out = {
        "retrieved": {"id": retrieved.id, "object": retrieved.object, "owned_by": retrieved.owned_by},
        "unknown_retrieve": refusal(lambda: client.models.retrieve("gpt-4o")),
        "unknown_chat": refusal(
            lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": q["query"]}])
        ),
        "answers": [message_of(ask(client, q)), streamed(client, q)],
        "no_route": raw_get(root(spec) + "/v1/embeddings")["status"],
    }
    out["after"] = scrape(spec)
    # Eight long answers on a batch of two: scraped while they run, two rows decode and
    # the rest wait in the queue.
    long_answer = dict(temperature=2.0, seed=11, max_tokens=250)
    seen = {"batch_rows": 0, "queue_depth": 0}
    running = threading.Event()
    running.set()

    def watch():
        while running.is_set():
            samples = scrape(spec)["samples"]
            seen["batch_rows"] = max(seen["batch_rows"], samples["needle_batch_rows{}"])
            seen["queue_depth"] = max(seen["queue_depth"], samples["needle_queue_depth{}"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda i: message_of(ask(client, q, **{**long_answer, "seed": i})), range(8)))
    running.clear()
    watcher.join()
    out["burst"] = burst
    out["seen"] = seen
    out["before"] = before
    out["end"] = scrape(spec)
    # After the last scrape, so that the counts above stay as they are.
    out["no_route_one_connection"] = refused_on_one_connection(spec, "/v1/embeddings")
    return out


def stops(spec):
    """`stop` in each of the spec's forms, whole and streamed, and too many sequences."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    q = spec["queries"][0]
    out = {
        name: {"whole": message_of(ask(client, q, stop=stop)), "stream": streamed(client, q, stop=stop)}
        for name, stop in spec["stops"].items()
    }
    out["too_many"] = refusal(lambda: ask(client, q, stop=["a", "b", "c", "d", "e"]))
    out["empty"] = refusal(lambda: ask(client, q, stop=[""]))
    return out


def choices(spec):
    """`n` (sampled and greedy, whole and streamed) against single requests with each
    choice's seed, and `logprobs` whole, streamed, under a named tool's grammar and in the
    conversation that continues the first."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    q = spec["queries"][0]
    sampled = dict(temperature=1.0, seed=5, max_tokens=80)
    forced = {"type": "function", "function": {"name": spec["forced_tool"]}}
    logprobs = message_of(ask(client, q, logprobs=True, top_logprobs=5))
    return {
        "n3": message_of(ask(client, q, n=3, **sampled)),
        "singles": [message_of(ask(client, q, **{**sampled, "seed": 5 + i})) for i in range(3)],
        "n3_stream": streamed(client, q, n=3, **sampled),
        "greedy_n2": message_of(ask(client, q, n=2)),
        "logprobs": logprobs,
        # Its prompt continues the one before: the conversation after that answer's calls.
        "continued": message_of(
            client.chat.completions.create(
                model="needle-demo",
                messages=after_tools(q, logprobs["tool_calls"]),
                tools=openai_tools(q["tools"]),
                logprobs=True,
                top_logprobs=5,
                max_tokens=48,
            )
        ),
        "logprobs_stream": streamed(client, q, logprobs=True, top_logprobs=5),
        "logprobs_forced": message_of(ask(client, q, logprobs=True, top_logprobs=3, tool_choice=forced)),
        "no_logprobs": message_of(ask(client, q))["logprobs"],
    }


def auth(spec):
    """A server run with --api-key: the client with the key, with another, and raw
    requests without one."""
    good = OpenAI(base_url=spec["base_url"], api_key=spec["key"], max_retries=0)
    bad = OpenAI(base_url=spec["base_url"], api_key="sk-wrong", max_retries=0)
    q = spec["queries"][0]
    bearer = {"Authorization": "Bearer " + spec["key"]}
    no_key_chat = raw_post(spec["base_url"], json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
    return {
        "wrong_key": {
            "models": refusal(lambda: bad.models.list()),
            "retrieve": refusal(lambda: bad.models.retrieve("needle-demo")),
            "chat": refusal(lambda: ask(bad, q)),
            "stream": refusal(lambda: list(ask(bad, q, stream=True))),
        },
        "no_key": {
            "chat": no_key_chat,
            "metrics": raw_get(root(spec) + "/metrics")["status"],
            "models": raw_get(spec["base_url"] + "/models")["status"],
            "unknown_route": raw_get(root(spec) + "/v1/nothing")["status"],
            "one_connection": refused_on_one_connection(spec),
        },
        "health": raw_get(root(spec) + "/health")["status"],
        "with_key": {
            "models": [m.id for m in good.models.list()],
            "answer": message_of(ask(good, q)),
            "metrics": scrape(spec, bearer)["samples"],
        },
    }


def structured(spec):
    """`response_format` `json_schema`: the demo's set_lights parameters as the schema, whole
    and streamed, and the SDK's own `parse` with a Pydantic model (its strict schema); the
    named-tool call of the same query beside them."""
    import jsonschema
    from typing import Literal
    from pydantic import BaseModel

    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    tool = spec["tool"]
    user = [{"role": "user", "content": spec["query"]}]
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": tool["name"], "description": tool["description"], "schema": tool["parameters"], "strict": True},
    }
    whole = client.chat.completions.create(model="needle-demo", messages=user, response_format=fmt)
    content = whole.choices[0].message.content
    jsonschema.validate(json.loads(content), tool["parameters"])
    streamed_content = ""
    for chunk in client.chat.completions.create(model="needle-demo", messages=user, response_format=fmt, stream=True):
        for choice in chunk.choices:
            streamed_content += choice.delta.content or ""
    rooms = tuple(tool["parameters"]["properties"]["room"]["enum"])

    class SetLights(BaseModel):
        """Turn the lights in a room on or off."""

        room: Literal[rooms]  # type: ignore[valid-type]
        on: bool

    parsed = client.chat.completions.parse(model="needle-demo", messages=user, response_format=SetLights)
    named = ask(
        client,
        {"query": spec["query"], "tools": [tool]},
        tool_choice={"type": "function", "function": {"name": tool["name"]}},
    )
    return {
        "content": content,
        "finish_reason": whole.choices[0].finish_reason,
        "tool_calls": bool(whole.choices[0].message.tool_calls),
        "streamed_content": streamed_content,
        "parsed": parsed.choices[0].message.parsed.model_dump(),
        "named_call": json.loads(named.choices[0].message.tool_calls[0].function.arguments),
        "with_tools": refusal(
            lambda: client.chat.completions.create(
                model="needle-demo", messages=user, response_format=fmt, tools=openai_tools([tool])
            )
        ),
        "json_object": json_object(client, user),
    }


def json_object(client, user):
    """`response_format` `json_object`: whatever object the model writes, whole and streamed."""
    fmt = {"type": "json_object"}
    whole = client.chat.completions.create(model="needle-demo", messages=user, response_format=fmt, max_tokens=96)
    streamed = ""
    for chunk in client.chat.completions.create(
        model="needle-demo", messages=user, response_format=fmt, max_tokens=96, stream=True
    ):
        for choice in chunk.choices:
            streamed += choice.delta.content or ""
    content = whole.choices[0].message.content
    return {
        "content": content,
        "is_object": isinstance(json.loads(content), dict),
        "finish_reason": whole.choices[0].finish_reason,
        "streamed_content": streamed,
    }


def at_once(spec):
    """Every query at once, each on its own connection."""
    client = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    queries = spec["queries"]
    with concurrent.futures.ThreadPoolExecutor(len(queries)) as pool:
        return {"answers": list(pool.map(lambda q: message_of(ask(client, q)), queries))}


if __name__ == "__main__":
    spec = json.load(sys.stdin)
    scenario = {
        "answers": answers,
        "limits": limits,
        "timeout": timeout,
        "drain": drain,
        "models_and_metrics": models_and_metrics,
        "auth": auth,
        "stops": stops,
        "choices": choices,
        "structured": structured,
        "at_once": at_once,
    }[spec["scenario"]]
    json.dump(scenario(spec), sys.stdout)
