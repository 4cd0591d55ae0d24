"""langchain-openai against `needle-run serve`, its documented way (report shape: home.py).

Tools are the functions of home.py through LangChain's `@tool` (its default: the docstring
is the description), bound with `ChatOpenAI.bind_tools`; the loop is LangChain's tool loop
(the AIMessage, then each call's ToolMessage from `tool.invoke(call)`, then the model
again); structured output is `with_structured_output`'s default (`json_schema`); streaming
is the same loop through `.stream`, the chunks added up.
"""

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import home

MAX_TURNS = 4


def main():
    spec = home.spec()
    llm = ChatOpenAI(model=spec["model"], base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    tools = {name: tool(f) for name, f in home.FUNCTIONS.items()}

    def bound(names):
        return llm.bind_tools([tools[n] for n in names])

    def first_calls(q):
        message = bound(q["tools"]).invoke(q["query"])
        return [{"name": c["name"], "arguments": c["args"]} for c in message.tool_calls]

    def loop(q, step):
        model = bound(q["tools"])
        messages = [HumanMessage(q["query"])]
        for _ in range(MAX_TURNS):
            message = step(model, messages)
            messages.append(message)
            if not message.tool_calls:
                return {"calls": home.taken(), "final": message.content, "error": None}
            for call in message.tool_calls:
                messages.append(tools[call["name"]].invoke(call))
        raise RuntimeError(f"no answer in {MAX_TURNS} turns")

    def invoked(model, messages):
        return model.invoke(messages)

    def streamed(model, messages):
        total = None
        for chunk in model.stream(messages):
            total = chunk if total is None else total + chunk
        return total

    def structured():
        value = llm.with_structured_output(home.Lights).invoke(spec["structured"]["query"])
        return {"value": value.model_dump(exclude_none=True)}

    home.report({
        "calls": [home.attempt(first_calls, q) for q in spec["calls"]],
        "loops": [home.attempt(loop, q, invoked) for q in spec["loops"]],
        "structured": home.attempt(structured),
        "stream": home.attempt(loop, spec["loops"][0], streamed),
    })


main()
