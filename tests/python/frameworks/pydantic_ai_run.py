"""pydantic-ai against `needle-run serve`, its documented way (report shape: home.py).

Tools are the functions of home.py given to `Agent(tools=...)` (their docstrings parsed);
the model is `OpenAIChatModel` with an `OpenAIProvider` at the server. The agent's own
loop runs the tools and sends their results back; the first-call figure is the calls of
its first model response (`Agent.iter`, stopped there). Structured output is `output_type`'s default (a tool the
answer calls); streaming is `run_stream_events`.
"""

import asyncio

from pydantic_ai import Agent, AgentRunResultEvent
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

import home

LIMITS = UsageLimits(request_limit=4)


async def main():
    spec = home.spec()
    model = OpenAIChatModel(spec["model"], provider=OpenAIProvider(base_url=spec["base_url"], api_key="not-needed"))

    def agent(q):
        return Agent(model, tools=home.functions(q["tools"]))

    async def first_calls(q):
        async with agent(q).iter(q["query"], usage_limits=LIMITS) as run:
            async for node in run:
                if Agent.is_call_tools_node(node):
                    parts = node.model_response.parts
                    return [{"name": p.tool_name, "arguments": p.args_as_dict()} for p in parts if isinstance(p, ToolCallPart)]
        raise RuntimeError("the run ended before a model response")

    async def loop(q):
        result = await agent(q).run(q["query"], usage_limits=LIMITS)
        return {"calls": home.taken(), "final": result.output, "error": None}

    async def streamed(q):
        final = None
        async with agent(q).run_stream_events(q["query"], usage_limits=LIMITS) as events:
            async for event in events:
                if isinstance(event, AgentRunResultEvent):
                    final = event.result.output
        return {"calls": home.taken(), "final": final, "error": None}

    async def structured():
        result = await Agent(model, output_type=home.Lights).run(spec["structured"]["query"], usage_limits=LIMITS)
        return {"value": result.output.model_dump(exclude_none=True)}

    await home.report_async(spec, first_calls, loop, structured, streamed)


asyncio.run(main())
