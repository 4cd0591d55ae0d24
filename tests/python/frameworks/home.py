"""The demo's six tools the way an application using an agent framework writes them: typed,
documented Python functions (every framework reads its tool schema from these) and Pydantic
models, plus the reading and writing every framework script of this folder shares.

A framework script reads a spec on stdin:

    {"base_url": ..., "model": ..., "calls": [{"query", "tools": [names]}],
     "loops": [{"query", "tools": [names]}], "structured": {"query"}}

and prints on stdout what the framework got, in one shape for all of them (the judging is
runner/tests/frameworks.rs'):

    {"calls": [[{"name", "arguments"}] or {"error"}],       one per spec call query
     "loops": [{"calls": [...], "final": str, "error"}],    the framework's agent loop
     "structured": {"value": {...}} or {"error"},           its default structured output
     "stream": {"calls": [...], "final": str} or {"error"}} its streaming path (loops[0])

The tools record their calls in CALLED and answer the way real tools do: a short status,
weather as a dict.
"""

import json
import sys
import traceback
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, Field

Room = Literal["living room", "kitchen", "bedroom", "bathroom", "office", "garage", "hallway", "dining room"]
Mode = Literal["heat", "cool", "auto"]
# A percentage, bounded as the demo's tools.json bounds it (Pydantic writes minimum/maximum).
Percent = Annotated[int, Field(ge=0, le=100)]

CALLED = []


def _record(name, **arguments):
    CALLED.append({"name": name, "arguments": {k: v for k, v in arguments.items() if v is not None}})


def set_lights(room: Room, on: bool, brightness: Optional[Percent] = None) -> str:
    """Turn the lights in a room on or off, optionally setting brightness.

    Args:
        room: Room name.
        on: True to turn on, false to turn off.
        brightness: Brightness percent 0-100.
    """
    _record("set_lights", room=room, on=on, brightness=brightness)
    return "done"


def set_thermostat(temperature: int, mode: Optional[Mode] = None) -> str:
    """Set the thermostat target temperature and optionally the mode.

    Args:
        temperature: Target temperature in degrees.
        mode: Thermostat mode.
    """
    _record("set_thermostat", temperature=temperature, mode=mode)
    return "ok"


def play_music(artist: str, volume: Optional[Percent] = None) -> str:
    """Play music by an artist, optionally at a volume.

    Args:
        artist: Artist or band name.
        volume: Volume percent 0-100.
    """
    _record("play_music", artist=artist, volume=volume)
    return "playing"


def set_timer(minutes: int, label: Optional[str] = None) -> str:
    """Start a countdown timer.

    Args:
        minutes: Duration in minutes.
        label: Optional timer label.
    """
    _record("set_timer", minutes=minutes, label=label)
    return "timer started"


def send_message(to: str, text: str) -> str:
    """Send a text message to a contact.

    Args:
        to: Contact name.
        text: Message body.
    """
    _record("send_message", to=to, text=text)
    return "sent"


def get_weather(city: str) -> dict:
    """Get the current weather for a city.

    Args:
        city: City name.
    """
    _record("get_weather", city=city)
    return {"temperature": 18, "condition": "sunny"}


FUNCTIONS = {f.__name__: f for f in (set_lights, set_thermostat, play_music, set_timer, send_message, get_weather)}


class Lights(BaseModel):
    """The lights a request asks for."""

    room: Room = Field(description="Room name.")
    on: bool = Field(description="True to turn on, false to turn off.")
    brightness: Optional[Percent] = Field(default=None, description="Brightness percent 0-100.")


def functions(names):
    return [FUNCTIONS[n] for n in names]


def spec():
    return json.load(sys.stdin)


def error(exc):
    """An exception as the one line the report carries (its type first)."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:400]


def taken():
    """The calls the tools recorded since the last take."""
    calls = list(CALLED)
    CALLED.clear()
    return calls


def attempt(f, *args):
    """`f(*args)`'s report, or {"error"} with the traceback on stderr."""
    try:
        return f(*args)
    except Exception as exc:  # the report says which framework path failed and how
        traceback.print_exc(file=sys.stderr)
        taken()
        return {"error": error(exc)}


async def attempt_async(f, *args):
    """[`attempt`] of a coroutine function."""
    try:
        return await f(*args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        taken()
        return {"error": error(exc)}


async def report_async(spec, first_calls, loop, structured, streamed):
    """Runs an async framework's four paths over `spec` and prints the report."""
    report({
        "calls": [await attempt_async(first_calls, q) for q in spec["calls"]],
        "loops": [await attempt_async(loop, q) for q in spec["loops"]],
        "structured": await attempt_async(structured),
        "stream": await attempt_async(streamed, spec["loops"][0]),
    })


def report(out):
    json.dump(out, sys.stdout)
