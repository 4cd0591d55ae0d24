"""openai-agents against `needle-run serve`, its documented way (report shape: home.py).

Tools are the functions of home.py through `function_tool` (strict schemas, the docstring
parsed); the agent uses the library's defaults: the Responses API and the default loop (the
tools' outputs go back, the model runs again). The first-call figure stops at the first tool
call (`tool_use_behavior="stop_on_first_tool"`); structured output is `output_type`;
streaming is `Runner.run_streamed`. Tracing is off (it would export to api.openai.com).
"""

import asyncio

from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

import home

MAX_TURNS = 4


async def main():
    spec = home.spec()
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0))
    tools = {name: function_tool(f) for name, f in home.FUNCTIONS.items()}

    def agent(q, **options):
        return Agent(name="home", model=spec["model"], tools=[tools[n] for n in q["tools"]], **options)

    async def first_calls(q):
        await Runner.run(agent(q, tool_use_behavior="stop_on_first_tool"), q["query"], max_turns=MAX_TURNS)
        return home.taken()

    async def loop(q):
        result = await Runner.run(agent(q), q["query"], max_turns=MAX_TURNS)
        return {"calls": home.taken(), "final": result.final_output, "error": None}

    async def streamed(q):
        run = Runner.run_streamed(agent(q), q["query"], max_turns=MAX_TURNS)
        async for _ in run.stream_events():
            pass
        return {"calls": home.taken(), "final": run.final_output, "error": None}

    async def structured():
        typed = Agent(name="home", model=spec["model"], output_type=home.Lights)
        result = await Runner.run(typed, spec["structured"]["query"], max_turns=MAX_TURNS)
        return {"value": result.final_output.model_dump(exclude_none=True)}

    await home.report_async(spec, first_calls, loop, structured, streamed)


asyncio.run(main())
