"""openai-agents against `needle-run serve`'s Responses API (runner/tests/serve.rs runs it).

Reads {"base_url", "queries", "plain_query"} as JSON on stdin and prints what the agents
got as JSON on stdout; the judging is the Rust test's. The agents use the library's
defaults: the Responses API, the default model settings, strict function tools. Only
tracing is off (it would export to api.openai.com) and, where said, the agent stops at its
first tool call (`tool_use_behavior="stop_on_first_tool"`), since the demo model was not
trained to answer after a tool's result.
"""

import asyncio
import json
import sys

from agents import Agent, FunctionTool, Runner, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI


def home_tools(defs, seen):
    def tool(d):
        async def invoke(ctx, arguments):
            seen.append({"name": d["name"], "arguments": json.loads(arguments)})
            return f"{d['name']} done"

        return FunctionTool(
            name=d["name"],
            description=d.get("description", ""),
            params_json_schema=d.get("parameters") or {"type": "object", "properties": {}},
            on_invoke_tool=invoke,
        )

    return [tool(d) for d in defs]


def sent(tools):
    """The tools as the agent sends them (its strict schemas), in Needle's flat form."""
    return [{"name": t.name, "description": t.description, "parameters": t.params_json_schema} for t in tools]


async def run(spec):
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0))
    q = spec["queries"][0]
    out = {}

    seen = []
    tools = home_tools(q["tools"], seen)
    agent = Agent(name="home", model="needle-demo", tools=tools, tool_use_behavior="stop_on_first_tool")
    result = await Runner.run(agent, q["query"])
    raw = result.raw_responses[0]
    out["run"] = {
        "calls": seen,
        "final_output": result.final_output,
        "output_types": [item.type for item in raw.output],
        "ids": {"response": raw.response_id, "calls": [item.call_id for item in raw.output]},
        "usage": {"input": raw.usage.input_tokens, "output": raw.usage.output_tokens},
        "sent_tools": sent(tools),
    }

    seen = []
    agent = Agent(name="home", model="needle-demo", tools=home_tools(q["tools"], seen), tool_use_behavior="stop_on_first_tool")
    streamed = Runner.run_streamed(agent, q["query"])
    events, arguments = [], {}
    async for event in streamed.stream_events():
        if event.type == "raw_response_event":
            data = event.data
            events.append(data.type)
            if data.type == "response.function_call_arguments.delta":
                arguments[data.item_id] = arguments.get(data.item_id, "") + data.delta
    out["stream"] = {
        "calls": seen,
        "final_output": streamed.final_output,
        "events": events,
        "arguments": [json.loads(a) for a in arguments.values()],
    }

    seen = []
    plain = Agent(name="home", model="needle-demo", tools=home_tools(q["tools"], seen), tool_use_behavior="stop_on_first_tool")
    result = await Runner.run(plain, spec["plain_query"])
    out["plain"] = {"calls": seen, "final_output": result.final_output}

    # The default tool_use_behavior sends the tools' outputs back and runs the model again,
    # until it answers without calls (or max_turns).
    seen = []
    default = Agent(name="home", model="needle-demo", tools=home_tools(q["tools"], seen))
    try:
        result = await Runner.run(default, q["query"], max_turns=4)
        out["continued"] = {
            "error": None,
            "calls": seen,
            "final_output": result.final_output,
            "turns": len(result.raw_responses),
        }
    except Exception as e:  # noqa: BLE001 - what the library raises is what is reported
        body = getattr(e, "body", None)
        out["continued"] = {
            "error": type(e).__name__,
            "status": getattr(e, "status_code", None),
            "param": body.get("param") if isinstance(body, dict) else None,
            "message": body.get("message") if isinstance(body, dict) else str(e),
            "calls": seen,
        }
    # output_type: the Responses API's text.format json_schema (strict), the agent's final
    # output a value of the model.
    from typing import Literal
    from pydantic import BaseModel, Field

    rooms = tuple(next(t for t in q["tools"] if t["name"] == "set_lights")["parameters"]["properties"]["room"]["enum"])

    class Lights(BaseModel):
        room: Literal[rooms] = Field(description="Room name.")  # type: ignore[valid-type]
        on: bool = Field(description="True to turn on, false to turn off.")

    typed = Agent(name="home", model="needle-demo", output_type=Lights)
    result = await Runner.run(typed, "turn off the kitchen lights")
    out["typed"] = {"final_output": result.final_output.model_dump(), "kind": type(result.final_output).__name__}
    return out


if __name__ == "__main__":
    json.dump(asyncio.run(run(json.load(sys.stdin))), sys.stdout)
