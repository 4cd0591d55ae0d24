"""instructor against `needle-run serve`, its documented way (report shape: home.py).

instructor declares tools as Pydantic models: each function of home.py becomes the model
of its arguments (named as the function, its docstring's summary and argument texts), and
several possible calls are `Iterable[Union[...]]` in `Mode.PARALLEL_TOOLS`. instructor has
no agent loop (it returns the parsed calls; running them is the caller's), so "loops" is
null. Structured output is `response_model` in the default `Mode.TOOLS`; streaming is
`create_partial`, its last partial the value.
"""

import inspect
from typing import Iterable, Union

import docstring_parser
import instructor
from instructor.core.exceptions import InstructorRetryException
from openai import OpenAI
from pydantic import Field, create_model

import home


def arguments_model(f):
    doc = docstring_parser.parse(f.__doc__)
    texts = {p.arg_name: p.description for p in doc.params}
    fields = {
        name: (p.annotation, Field(... if p.default is inspect.Parameter.empty else p.default, description=texts.get(name)))
        for name, p in inspect.signature(f).parameters.items()
    }
    return create_model(f.__name__, __doc__=doc.short_description, **fields)


def main():
    spec = home.spec()
    openai = OpenAI(base_url=spec["base_url"], api_key="not-needed", max_retries=0)
    client = instructor.from_openai(openai)
    parallel = instructor.from_openai(openai, mode=instructor.Mode.PARALLEL_TOOLS)
    models = {name: arguments_model(f) for name, f in home.FUNCTIONS.items()}

    def user(text):
        return [{"role": "user", "content": text}]

    def first_calls(q):
        union = Union[tuple(models[n] for n in q["tools"])]
        try:
            calls = parallel.chat.completions.create(
                model=spec["model"], response_model=Iterable[union], messages=user(q["query"]), max_retries=0)
        except InstructorRetryException as exc:
            # instructor raises where the model calls nothing (its answer: no tool applies).
            message = exc.last_completion.choices[0].message if exc.last_completion else None
            if message is not None and not message.tool_calls:
                return []
            raise
        return [{"name": type(c).__name__, "arguments": c.model_dump(exclude_none=True)} for c in calls]

    def structured():
        value = client.chat.completions.create(
            model=spec["model"], response_model=home.Lights, messages=user(spec["structured"]["query"]), max_retries=0)
        return {"value": value.model_dump(exclude_none=True)}

    def streamed():
        last = None
        for last in client.chat.completions.create_partial(
                model=spec["model"], response_model=home.Lights, messages=user(spec["structured"]["query"]), max_retries=0):
            pass
        return {"value": last.model_dump(exclude_none=True)}

    home.report({
        "calls": [home.attempt(first_calls, q) for q in spec["calls"]],
        "loops": None,
        "structured": home.attempt(structured),
        "stream": home.attempt(streamed),
    })


main()
