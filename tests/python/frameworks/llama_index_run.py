"""llama-index against `needle-run serve`, its documented way (report shape: home.py).

The model is `OpenAILike` (a chat model that calls functions, with the window the server
reports as `max_model_len`, greedy); tools are the functions of home.py through `FunctionTool.from_defaults` (the
signature and docstring as the description). The first-call figure is
`chat_with_tools` (`allow_parallel_tool_calls=True`: its default allows one call, and
some held-out queries ask for two) read by `get_tool_calls_from_response`; the loop is `FunctionAgent`;
structured output is `structured_predict` (a function call for such a model); streaming
is the agent's `stream_events`.
"""

import asyncio
import json
import urllib.request

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

import home


def served_window(spec):
    """The model's positions, as the server reports them (vLLM's `max_model_len`)."""
    with urllib.request.urlopen(f"{spec['base_url']}/models/{spec['model']}") as r:
        return json.load(r)["max_model_len"]


async def main():
    spec = home.spec()
    llm = OpenAILike(
        model=spec["model"],
        api_base=spec["base_url"],
        api_key="not-needed",
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=served_window(spec),
        max_retries=0,
        # Greedy, as needle-run decodes and the other frameworks' defaults leave it:
        # OpenAILike's default 0.1 samples, and the calls are judged against needle-run's.
        temperature=0.0,
    )
    tools = {name: FunctionTool.from_defaults(fn=f) for name, f in home.FUNCTIONS.items()}

    def chosen(q):
        return [tools[n] for n in q["tools"]]

    async def first_calls(q):
        response = await llm.achat_with_tools(chosen(q), user_msg=q["query"], allow_parallel_tool_calls=True)
        calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
        return [{"name": c.tool_name, "arguments": c.tool_kwargs} for c in calls]

    def agent(q):
        return FunctionAgent(tools=chosen(q), llm=llm)

    async def loop(q):
        response = await agent(q).run(user_msg=q["query"], max_iterations=4)
        return {"calls": home.taken(), "final": str(response), "error": None}

    async def streamed(q):
        handler = agent(q).run(user_msg=q["query"], max_iterations=4)
        async for _ in handler.stream_events():
            pass
        response = await handler
        return {"calls": home.taken(), "final": str(response), "error": None}

    async def structured():
        value = await llm.astructured_predict(home.Lights, PromptTemplate(spec["structured"]["query"]))
        return {"value": value.model_dump(exclude_none=True)}

    await home.report_async(spec, first_calls, loop, structured, streamed)


asyncio.run(main())
