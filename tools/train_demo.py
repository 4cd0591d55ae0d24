#!/usr/bin/env python3
"""Fine-tunes the built-in demo model (`runner/demo/needle-demo.cact`) so that it also
closes a tool loop, and exports, evaluates and (with --ship) replaces it.

Runs on upstream's `cactus-needle==2.0.15` (JAX/flax): the model is
`needle.model.architecture.SimpleAttentionNetwork`, single-turn prompts and targets are
`needle.model.finetune.render_example`'s, weights are read back with
`needle.model.export.read_export` and written with `write_export`, and the last 25% of
the steps train through `needle.model.quantize.cq_ste_params` (CQ W4 straight-through
fake quantisation, the export's numerics).

What it trains on (all generated here, seeded):

- single turns: templated queries for the six tools of `runner/demo/tools.json`, one or
  two calls or none (off-topic), the relevant tools plus distractors or the full list,
  in `render_example`'s format;
- conversations in the format `runner/src/prompt.rs` renders (`render_conversation`):
  after `<tool_call>LIST</tool_call><|im_end|>\\n` comes
  `<|im_start|>user\\n<tool_result>RESULTS</tool_result><|im_end|>\\n<|im_start|>assistant\\n`
  and the target is a short prose confirmation (`PROSE<|im_end|>`, no `<think>`), or,
  when a two-step request has only had its first call, the next call in the trained
  single-turn answer form;
- some prompts carry a system message, tools without descriptions, or llama-index's
  long descriptions (signature + docstring); the other schema shapes frameworks generate
  are left to `runner/src/tool_schema.rs`, which renders them in the trained form.

No query of `runner/demo/eval.jsonl` and none of its string slot values appear in the
training data: such examples are dropped and counted.

    python tools/train_demo.py --work DIR [--minutes 45] [--ship]
    python tools/train_demo.py --work DIR --eval-only runner/demo/needle-demo.cact
"""
import argparse
import functools
import json
import math
import os
import pickle
import random
import re
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "runner", "demo")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
BOS, EOS, PAD = 2, 1, 0


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------- weights and tokenizer

def demo_config(max_seq_len):
    from needle.model.architecture import TransformerConfig
    return TransformerConfig(
        vocab_size=1024, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4,
        max_seq_len=max_seq_len, engram_orders=(2, 3), engram_layers=(1, 2),
        engram_slots=1024, mhc_lanes=4, rope_theta=100000.0, dtype="float32",
        flash=False, remat=False)


def load_cact(path, max_seq_len):
    """The float parameters dequantized from a demo `.cact` (the inverse of upstream's
    `export._tensors`), the config, and the tokenizer blob. The MTP head, which the file
    does not hold, keeps a fresh initialisation (it is neither trained on nor exported)."""
    import jax
    import jax.numpy as jnp
    from needle.model.architecture import SimpleAttentionNetwork
    from needle.model.export import read_export
    meta, ts = read_export(path)
    config = demo_config(max_seq_len)
    for key in ("d_model", "num_heads", "num_kv_heads", "num_layers", "vocab_size",
                "engram_slots", "mhc_lanes"):
        assert meta[key] == getattr(config, key), key
    params = SimpleAttentionNetwork(config).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    params = jax.tree.map(np.asarray, params)
    it = iter(ts)
    nxt = lambda: np.asarray(next(it), np.float32)
    params["embedding"]["embedding"] = nxt()
    b = params["stack"]["layers"]["block"]
    sa, ha = b["self_attn"], b["hadamard_mlp"]
    L = config.num_layers
    per_layer = [[] for _ in range(14)]
    for _ in range(L):
        for j in range(14):
            per_layer[j].append(nxt())
    st = lambda j, t=False: np.stack([w.T if t else w for w in per_layer[j]])
    b["ZCRMSNorm_0"]["scale"] = st(0)
    sa["q_proj"]["kernel"], sa["k_proj"]["kernel"], sa["v_proj"]["kernel"] = st(1, 1), st(2, 1), st(3, 1)
    sa["q_norm"]["scale"], sa["k_norm"]["scale"] = st(4), st(5)
    sa["gate_proj"]["kernel"], sa["out_proj"]["kernel"] = st(6, 1), st(7, 1)
    b["post_attn_norm"]["scale"] = st(8)
    b["attn_gate"] = st(9).reshape(L)
    b["pre_hada_norm"]["scale"] = st(10)
    ha["d1"], ha["d2"], ha["d3"] = st(11), st(12), st(13)
    mhc = params["stack"]
    for name in ("mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res"):
        mhc[name] = nxt().reshape(mhc[name].shape)
    for name in ("mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"):
        Ln, nC, lanes = mhc[name].shape
        mhc[name] = nxt().reshape(Ln, lanes, nC).transpose(0, 2, 1)
    for s in range(len(config.engram_layers)):
        eg = params[f"engrams_{s}"]
        eg["embedding"] = nxt().reshape(eg["embedding"].shape)
        eg["key_proj"]["kernel"] = nxt().T
        eg["value_proj"]["kernel"] = nxt().T
        eg["taps"] = nxt()
    params["stack"]["final_norm"]["scale"] = nxt()
    blob = next(it)
    assert isinstance(blob, (bytes, bytearray)), "expected the tokenizer blob after final_norm"
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    return params, config, bytes(blob)


class Tokenizer:
    """The `.cact`'s SentencePiece BPE: upstream's `RefTokenizer` encoding, cached per
    word (no piece holds `▁` after its first character, so BPE never merges across a
    word start), and a `.sp` view of the pieces so `write_export` writes the same blob."""

    def __init__(self, blob):
        from needle.model.export import RefTokenizer, parse_tokenizer_blob
        self.meta = parse_tokenizer_blob(blob)
        self.ref = RefTokenizer(self.meta)
        assert not any("▁" in p[1:] for p in self.meta["pieces"])
        self.vocab_size = len(self.meta["pieces"])
        self.sp = _PieceView(self.meta)
        self._marker_re = re.compile("(" + "|".join(map(re.escape, self.ref.markers)) + ")")

    @functools.lru_cache(maxsize=None)
    def _word(self, word):
        return tuple(self.ref._bpe(word))

    def encode(self, text):
        if not text:
            return []
        esc = text.replace(" ", "▁")
        if self.ref.add_dummy:
            esc = "▁" + esc
        ids = []
        for part in self._marker_re.split(esc):
            if not part:
                continue
            if part in self.ref.p2id and part in self.ref.markers:
                ids.append(self.ref.p2id[part])
                continue
            for word in re.findall("▁?[^▁]*|▁", part):
                if word:
                    ids.extend(self._word(word))
        return ids

    def decode(self, ids):
        return self.ref.decode(ids)


class _PieceView:
    def __init__(self, meta):
        self.m = meta

    def GetPieceSize(self):
        return len(self.m["pieces"])

    def IdToPiece(self, i):
        return self.m["pieces"][i]

    def GetScore(self, i):
        return self.m["scores"][i]

    def IsControl(self, i):
        return self.m["types"][i] == 2

    def IsUnknown(self, i):
        return self.m["types"][i] == 1

    def IsByte(self, i):
        return self.m["types"][i] == 4


# ---------------------------------------------------------------- data

ROOMS = ["living room", "kitchen", "bedroom", "bathroom", "office", "garage", "hallway", "dining room"]
MODES = ["heat", "cool", "auto"]
NAMES = ["Anna", "Ben", "Carlos", "Diana", "Ethan", "Fatima", "Gabriel", "Hannah", "Ivan", "Julia",
         "Kenji", "Laura", "Marco", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samuel", "Tara",
         "Umar", "Vera", "William", "Yusuf", "Zoe", "Mom", "Dad", "Alex", "Chloe", "Leo", "Maya",
         "Noah", "Olivia", "Peter", "Sofia", "Tom", "Lucas", "Emma", "Jack", "Mia"]
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Chicago", "Toronto", "Sydney",
          "Dublin", "Seoul", "Mumbai", "Cairo", "Boston", "Denver", "Seattle", "Vienna", "Prague",
          "Oslo", "Helsinki", "Athens", "Istanbul", "Nairobi", "Lima", "Bogota", "Hanoi", "Dallas",
          "Miami", "New York", "Los Angeles", "Rio de Janeiro", "Cape Town", "Mexico City"]
ARTISTS = ["Coldplay", "Adele", "Queen", "Drake", "Beyonce", "Radiohead", "Metallica", "Rihanna",
           "Shakira", "Eminem", "Madonna", "Nirvana", "Daft Punk", "Pink Floyd", "The Beatles",
           "Taylor Swift", "Ed Sheeran", "Bruno Mars", "Lady Gaga", "Bob Marley", "Miles Davis",
           "Arctic Monkeys", "Billie Eilish", "The Weeknd", "Dua Lipa", "Frank Sinatra", "ABBA"]
LABELS = ["pasta", "eggs", "tea", "pizza", "workout", "nap", "study", "break", "oven", "rice",
          "coffee", "meeting", "yoga", "cookies", "bread", "stretch", "reading", "homework"]
TEXTS = ["on my way", "running late", "call me back", "see you soon", "I'm home",
         "dinner is ready", "happy birthday", "thanks for today", "where are you",
         "meet me at the station", "bring some milk", "the door is open", "I love you",
         "don't forget the keys", "pick up the kids at five", "can we talk later"]
WORDS = ("red blue green big small late early home work car door milk bread tea box keys park "
         "school lunch dinner movie game book music phone bag shop store train bus station "
         "garden dog cat window light table chair water paper coffee friday monday today "
         "tomorrow tonight soon now morning evening please thanks okay great fine done").split()
OFF_TOPIC = ["tell me a joke", "what is the capital of France", "how old is the universe",
             "order a pizza", "book a flight to {city}", "what time is it", "who won the game",
             "translate hello to Spanish", "navigate to {city}", "call {name}",
             "what's two plus two", "set an alarm for 7 am", "read my email",
             "open the garage door", "lock the front door", "turn on the TV",
             "what's on my calendar", "buy more {label}", "how do I cook {label}",
             "recommend a good book", "how tall is Mount Everest", "sing me a song",
             "what does {name} look like", "remind me to call {name}"]
# Off-topic requests that name a number, a contact or a city (so a number, a name or a
# place alone is no reason to call a tool); drawn with --off-topic-extra.
OFF_TOPIC_EXTRA = ["what is {n} plus {m}", "what's {n} times {m}", "how much is {n} divided by {m}",
                   "convert {n} miles to kilometers", "is {n} a prime number",
                   "how many days are in {m} weeks", "what's {n} minus {m}", "count to {n}",
                   "how many grams are in {m} pounds", "what was the score, {m} to {n}?",
                   "what's {name}'s phone number", "add {name} to my contacts",
                   "when is {name}'s birthday", "block {name}", "how do you spell {name}",
                   "find a hotel in {city}", "what's the population of {city}",
                   "how far is {city} from here", "show me restaurants in {city}",
                   "what language do they speak in {city}", "what time is it in {city}"]
SYSTEMS = ["You are a helpful assistant.", "You are a helpful assistant. Use the tools when needed.",
           "You are a smart home assistant.", "You are a helpful agent.",
           "Answer briefly.", "You control the user's home and phone. Be concise."]

TEMPLATES = {
    "set_lights": [
        "turn {on} the {room} lights", "turn the {room} lights {on}", "switch {on} the {room} lights",
        "lights {on} in the {room}", "{room} lights {on}", "can you turn {on} the lights in the {room}",
        "please switch the {room} lights {on}", "put the {room} lights {on}", "flip the {room} lights {on}",
        "turn {on} the {room} lights at {brightness} percent", "set the {room} lights to {brightness}%",
        "dim the {room} lights to {brightness} percent", "{room} lights on at {brightness} percent",
        "switch the {room} lights on at {brightness}%",
    ],
    "set_thermostat": [
        "set the thermostat to {temperature}", "set the temperature to {temperature} degrees",
        "make it {temperature} degrees", "thermostat to {temperature}", "change the heat to {temperature}",
        "set the thermostat to {temperature} on {mode}", "{mode} mode at {temperature} degrees",
        "put the thermostat on {mode} at {temperature}", "set it to {temperature} degrees in {mode} mode",
        "can you make it {temperature} degrees with {mode}", "switch the thermostat to {mode} and {temperature} degrees",
    ],
    "play_music": [
        "play {artist}", "play some {artist}", "put on {artist}", "I want to hear {artist}",
        "start playing {artist}", "can you play {artist}", "play music by {artist}", "queue {artist}",
        "play {artist} at volume {volume}", "play {artist} at {volume} percent",
        "put on {artist} with the volume at {volume}", "play some {artist}, volume {volume}",
    ],
    "set_timer": [
        "set a timer for {minutes} minutes", "timer for {minutes} minutes", "start a {minutes} minute timer",
        "remind me in {minutes} minutes", "count down {minutes} minutes", "set a {minutes} minute timer",
        "set a {label} timer for {minutes} minutes", "start a {minutes} minute timer for {label}",
        "timer for {minutes} minutes called {label}", "{minutes} minute {label} timer please",
        "can you set a timer for {minutes} minutes labeled {label}",
    ],
    "send_message": [
        "text {to} saying {text}", "send {to} a message saying {text}", "message {to}: {text}",
        "tell {to} {text}", "send a text to {to} that says {text}", "text {to} {text}",
        "let {to} know {text}", "send a message to {to}: {text}", "can you text {to} and say {text}",
        "write to {to}: {text}",
    ],
    "get_weather": [
        "what's the weather in {city}", "weather in {city}", "how is the weather in {city}",
        "is it raining in {city}", "what's it like outside in {city}", "forecast for {city}",
        "tell me the weather for {city}", "how hot is it in {city}", "check the weather in {city}",
        "do I need an umbrella in {city}",
    ],
}
# The last template of each tool is the held-out conversation set's only.
HELD_OUT_TEMPLATES = {tool: ts[-1] for tool, ts in TEMPLATES.items()}
JOINERS = [" and ", ", then ", " and then ", ", and also ", ". Also ", " then ", " and also "]


class Slots:
    """Slot values: half from the lists above, half made up (pseudo-words, word strings),
    so the model learns to copy spans. `banned` values are never drawn."""

    def __init__(self, rng, banned, pools=None):
        self.rng = rng
        self.banned = {b.lower() for b in banned}
        p = pools or {}
        self.names = p.get("names", NAMES)
        self.cities = p.get("cities", CITIES)
        self.artists = p.get("artists", ARTISTS)
        self.labels = p.get("labels", LABELS)
        self.texts = p.get("texts", TEXTS)
        self.made_up = p.get("made_up", 0.5)
        self.markov = p.get("markov", 0.0)
        self.chain = None

    def pseudo(self):
        r = self.rng
        cons, vow = "bcdfghjklmnprstvwz", "aeiou"
        word = "".join(r.choice(cons) + r.choice(vow) + (r.choice("nrsl") if r.random() < 0.3 else "")
                       for _ in range(r.randint(1, 3)))
        return word

    def word(self):
        """A made-up word: with probability `markov` one from a letter-trigram chain over
        the training pools (double letters, real-looking endings), else a syllable word."""
        if self.markov and self.rng.random() < self.markov:
            return self.markov_word()
        return self.pseudo()

    def markov_word(self):
        if self.chain is None:
            words = sorted({w.lower() for pool in (self.names, self.cities, self.artists, self.labels,
                                            self.texts, WORDS) for v in pool for w in v.split()
                     if w.isalpha()})
            chain = {}
            for w in words:
                w = "^^" + w + "$"
                for i in range(2, len(w)):
                    chain.setdefault(w[i - 2:i], []).append(w[i])
            self.chain = chain
        for _ in range(20):
            ctx, out = "^^", ""
            while len(out) < 12:
                c = self.rng.choice(self.chain[ctx])
                if c == "$":
                    break
                out += c
                ctx = ctx[1] + c
            if 3 <= len(out) <= 11:
                return out
        return self.pseudo()

    def _pick(self, pool, make):
        for _ in range(50):
            value = make() if self.rng.random() < self.made_up else self.rng.choice(pool)
            if value.lower() not in self.banned:
                return value
        raise RuntimeError("no slot value left")

    def name(self):
        return self._pick(self.names, lambda: self.word().capitalize()
                          + ((" " + self.word().capitalize()) if self.rng.random() < 0.25 else ""))

    def city(self):
        return self._pick(self.cities, lambda: " ".join(self.word().capitalize()
                                                        for _ in range(self.rng.choice([1, 1, 1, 2]))))

    def artist(self):
        return self._pick(self.artists, lambda: " ".join(self.word().capitalize()
                                                         for _ in range(self.rng.choice([1, 2, 2, 3]))))

    def label(self):
        return self._pick(self.labels, lambda: self.word() if self.rng.random() < 0.5 else self.rng.choice(WORDS))

    def text(self):
        return self._pick(self.texts, lambda: " ".join(
            self.rng.choice(WORDS) if self.rng.random() < 0.7 else self.word()
            for _ in range(self.rng.randint(2, 5))))


def make_call(tool, slots, template):
    """One call of `tool` from `template`: the query fragment, the call, its reasoning."""
    r = slots.rng
    fill, args, reasons = {}, {}, []
    if tool == "set_lights":
        room, on = r.choice(ROOMS), r.random() < 0.5
        if "{brightness}" in template:
            on = True
        fill.update(room=room, on="on" if on else "off")
        args.update(room=room, on=on)
        reasons += [f"'{room}' -> room", f"'{'on' if on else 'off'}' -> on {'true' if on else 'false'}"]
        if "{brightness}" in template:
            b = r.randint(1, 100)
            fill["brightness"] = b
            args["brightness"] = b
            reasons.append(f"'{b}' -> brightness {b}")
    elif tool == "set_thermostat":
        t = r.choice([r.randint(15, 30), r.randint(60, 80)])
        fill["temperature"], args["temperature"] = t, t
        reasons.append(f"'{t}' -> temperature")
        if "{mode}" in template:
            m = r.choice(MODES)
            fill["mode"], args["mode"] = m, m
            reasons.append(f"'{m}' -> mode")
    elif tool == "play_music":
        a = slots.artist()
        fill["artist"], args["artist"] = a, a
        reasons.append(f"'{a}' -> artist")
        if "{volume}" in template:
            v = r.randint(1, 100)
            fill["volume"], args["volume"] = v, v
            reasons.append(f"'{v}' -> volume")
    elif tool == "set_timer":
        m = r.choice([r.randint(1, 15), r.randint(1, 120), r.choice([5, 10, 15, 20, 30, 45, 60, 90])])
        fill["minutes"], args["minutes"] = m, m
        reasons.append(f"'{m}' -> minutes")
        if "{label}" in template:
            lab = slots.label()
            fill["label"], args["label"] = lab, lab
            reasons.append(f"'{lab}' -> label")
    elif tool == "send_message":
        to, text = slots.name(), slots.text()
        fill.update(to=to, text=text)
        args.update(to=to, text=text)
        reasons += [f"'{to}' -> to", f"'{text}' -> text"]
    elif tool == "get_weather":
        c = slots.city()
        fill["city"], args["city"] = c, c
        reasons.append(f"'{c}' -> city")
    query = template.format(**fill)
    return query, {"name": tool, "arguments": args}, reasons


def single_turn(rng, slots, tools_by_name, templates, p_two=0.35, p_off=0.05, mix=None):
    """A single-turn example (`render_example`'s fields): query, tools, reasoning, answers.
    `mix`: `off_topic_extra` (also draw OFF_TOPIC_EXTRA), `tool_weights` (tool -> weight
    of being called; uniform without)."""
    mix = mix or {}
    names = list(tools_by_name)
    roll = rng.random()
    if roll < p_off:
        pool = OFF_TOPIC + OFF_TOPIC_EXTRA if mix.get("off_topic_extra") else OFF_TOPIC
        fill = dict(city=slots.city(), name=slots.name(), label=slots.label())
        if mix.get("off_topic_extra"):
            fill.update(n=rng.choice([rng.randint(2, 30), rng.randint(31, 150)]), m=rng.randint(2, 12))
        query = rng.choice(pool).format(**fill)
        if rng.random() < 0.5:
            query = query.capitalize()
        chosen, calls, reasons = [], [], ["no tool matches this request"]
    else:
        k = 2 if roll < p_off + p_two else 1
        weights = mix.get("tool_weights")
        if weights:
            chosen = []
            while len(chosen) < k:
                left = [n for n in names if n not in chosen]
                chosen += rng.choices(left, [weights.get(n, 1.0) for n in left])
        else:
            chosen = rng.sample(names, k)
        parts, calls, reasons = [], [], []
        for tool in chosen:
            q, call, rs = make_call(tool, slots, rng.choice(templates[tool]))
            parts.append(q)
            calls.append(call)
            reasons += rs
        query = parts[0]
        for p in parts[1:]:
            query += rng.choice(JOINERS) + p
        if rng.random() < 0.3:
            query = query[0].upper() + query[1:]
        if rng.random() < 0.15:
            query += rng.choice(["?", ".", " please", "!", " thanks"])
    if rng.random() < 0.35:
        tools = [tools_by_name[n] for n in names]
    else:
        extra = [n for n in names if n not in chosen]
        pick = list(chosen) + rng.sample(extra, min(len(extra), rng.randint(1, 2)))
        rng.shuffle(pick)
        tools = [tools_by_name[n] for n in pick]
    return {"query": query, "tools": tools, "reasoning": "; ".join(reasons), "answers": calls}


def prose(call, result):
    """The short confirmation of one call whose result is `result`."""
    a = call["arguments"]
    if isinstance(result, dict) and "error" in result:
        what = {"set_lights": "change the lights", "set_thermostat": "set the thermostat",
                "play_music": "play the music", "set_timer": "start the timer",
                "send_message": "send the message", "get_weather": "get the weather"}[call["name"]]
        return f"Sorry, I could not {what}: {result['error']}."
    name = call["name"]
    if name == "set_lights":
        if not a["on"]:
            return f"The {a['room']} lights are off."
        if "brightness" in a:
            return f"The {a['room']} lights are on at {a['brightness']} percent."
        return f"The {a['room']} lights are on."
    if name == "set_thermostat":
        mode = f" on {a['mode']}" if "mode" in a else ""
        return f"The thermostat is set to {a['temperature']} degrees{mode}."
    if name == "play_music":
        vol = f" at volume {a['volume']}" if "volume" in a else ""
        return f"Now playing {a['artist']}{vol}."
    if name == "set_timer":
        unit = "minute" if a["minutes"] == 1 else "minutes"
        label = f"{a['label']} " if "label" in a else ""
        return f"Your {label}timer is set for {a['minutes']} {unit}."
    if name == "send_message":
        return f"Your message to {a['to']} has been sent."
    city = a["city"]
    if isinstance(result, dict) and "temperature" in result:
        return f"It is {result['temperature']} degrees and {result['condition']} in {city}."
    if isinstance(result, str):
        return f"The weather in {city}: {result.rstrip('.')}."
    return f"I checked the weather in {city}."


CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "clear", "foggy", "snowy", "partly cloudy"]


def tool_result(rng, call, errors=0.08):
    """What a tool might send back, in the shapes frameworks pass on."""
    if rng.random() < errors:
        return {"error": rng.choice(["device offline", "not found", "permission denied",
                                     "service unavailable", "timeout"])}
    if call["name"] == "get_weather":
        t, c = rng.randint(-5, 35), rng.choice(CONDITIONS)
        return rng.choice([
            {"temperature": t, "condition": c},
            {"city": call["arguments"]["city"], "temperature": t, "condition": c},
            f"{c.capitalize()}, {t} degrees",
            f"{t} degrees and {c}",
        ])
    return rng.choice([{"ok": True}, {"status": "ok"}, {"success": True}, "done", "OK", "Done.",
                       "success", {"result": "done"}, True, None])


def conversation(rng, slots, tools_by_name, templates, mix=None):
    """A tool loop: a single-turn example whose calls were made, the turns after, and the
    target (prose, or the next call of a two-step request)."""
    for _ in range(100):
        ex = single_turn(rng, slots, tools_by_name, templates, p_two=0.4, p_off=0.0, mix=mix)
        if ex["answers"]:
            break
    calls = ex["answers"]
    results = [tool_result(rng, c) for c in calls]
    step = len(calls) == 2 and rng.random() < 0.4
    if step:
        first, second = calls
        turns = [("assistant", [first]), ("results", [results[0]])]
        if rng.random() < 0.5:
            reasons = [r for r in ex["reasoning"].split("; ") if r not in
                       make_reasons_of(first, ex["reasoning"])]
            target = answer_target("; ".join(reasons), [second])
        else:
            turns += [("assistant", [second]), ("results", [results[1]])]
            target = " ".join(prose(c, r) for c, r in zip(calls, results)) + IM_END
    else:
        turns = [("assistant", calls), ("results", results)]
        target = " ".join(prose(c, r) for c, r in zip(calls, results)) + IM_END
    ex["turns"] = turns
    ex["target"] = target
    return ex


def model_name(rng, tool):
    """A name a client's output model might have for what `tool` sets: `set_lights` ->
    `Lights`, `LightsRequest`, `SetLights`, ... (Pydantic names the schema after the class)."""
    verb, _, noun = tool.partition("_")
    noun, verb = noun.capitalize(), verb.capitalize()
    return rng.choice([noun, noun, noun + "Request", noun + "Settings", noun + "Args",
                       verb + noun, verb + noun + "Params"])


def structured(rng, slots, tools_by_name, templates, mix=None):
    """A request answered through `response_format` json_schema, rendered as `serve` does
    (upstream's `extract`): the only tool is named after the client's output model, has its
    docstring or no description, and some of the tool's parameters; the one call fills
    those it has."""
    weights = (mix or {}).get("tool_weights") or {}
    names = list(tools_by_name)
    tool = rng.choices(names, [weights.get(n, 1.0) for n in names])[0]
    query, call, reasons = make_call(tool, slots, rng.choice(templates[tool]))
    schema = tools_by_name[tool]["parameters"]
    required = schema.get("required", [])
    keep = [k for k in schema["properties"] if k in required or rng.random() < 0.5]
    args = {k: v for k, v in call["arguments"].items() if k in keep}
    call = {"name": model_name(rng, tool), "arguments": args}
    reasons = [r for r in reasons if r in make_reasons_of(call, "; ".join(reasons))]
    noun = tool.partition("_")[2].replace("_", " ")
    function = {"name": call["name"]}
    description = rng.choice([None, f"The {noun} a request asks for.", f"{noun.capitalize()} settings.",
                              f"Extract the {noun} from the text.", f"What the user wants for the {noun}."])
    if description:
        function["description"] = description
    function["parameters"] = {"type": "object",
                              "properties": {k: schema["properties"][k] for k in keep},
                              "required": [k for k in required if k in keep]}
    if rng.random() < 0.3:
        query = query[0].upper() + query[1:]
    return {"query": query, "tools": [function], "reasoning": "; ".join(reasons), "answers": [call]}


def make_reasons_of(call, reasoning):
    """The reasoning items that name `call`'s argument values."""
    values = {f"'{v}'" if not isinstance(v, bool) else None for v in call["arguments"].values()}
    values |= {"'on'", "'off'"} if "on" in call["arguments"] else set()
    return {r for r in reasoning.split("; ") if r.split(" -> ")[0] in values}


def answer_target(reasoning, calls):
    think = f"<think>\n{reasoning}\n</think>\n" if reasoning else ""
    return think + "<tool_call>" + compact(calls) + "</tool_call>" + IM_END


def render(ex):
    """(prompt, target) of an example: `render_example`'s for a single turn, and
    `runner/src/prompt.rs`'s `render_conversation` for one with turns."""
    from needle.model.finetune import render_example
    if "turns" not in ex:
        return render_example(ex)
    base = {k: ex[k] for k in ("query", "tools", "system") if k in ex}
    prompt, _ = render_example(base)
    for i, (kind, value) in enumerate(ex["turns"]):
        if kind == "assistant":
            prompt += "<tool_call>" + compact(value) + "</tool_call>" + IM_END + "\n"
        else:
            prompt += (IM_START + "user\n<tool_result>" + compact(value) + "</tool_result>"
                       + IM_END + "\n" + IM_START + "assistant\n")
    return prompt, ex["target"]


def llama_index_description(tool):
    """A llama-index `FunctionTool` description: the function's signature, then its
    docstring."""
    props = tool["parameters"]["properties"]
    req = set(tool["parameters"].get("required", []))
    py = {"string": "str", "integer": "int", "boolean": "bool", "number": "float"}
    sig = ", ".join(f"{k}: {py[v['type']]}" if k in req else f"{k}: Optional[{py[v['type']]}] = None"
                    for k, v in props.items())
    args = "\n".join(f"        {k}: {v.get('description', '')}" for k, v in props.items())
    return f"{tool['name']}({sig}) -> str\n{tool.get('description', '')}\n\n    Args:\n{args}\n    "


def shaped_tools(rng, tools):
    """The tools as some frameworks write them: without descriptions, or with
    llama-index's long ones. The rest of the schema shapes are the runner's to render in
    the trained form."""
    roll = rng.random()
    if roll < 0.08:
        out = []
        for t in tools:
            t = json.loads(json.dumps(t))
            t.pop("description", None)
            if rng.random() < 0.5:
                for p in t["parameters"]["properties"].values():
                    p.pop("description", None)
            out.append(t)
        return out
    if roll < 0.18:
        return [dict(t, description=llama_index_description(t)) for t in tools]
    return tools


def held_out_values():
    """The string slot values and queries of `eval.jsonl`."""
    values, queries = set(), set()
    for line in open(os.path.join(DEMO, "eval.jsonl")):
        ex = json.loads(line)
        queries.add(norm(ex["query"]))
        for call in ex["answers"]:
            for k, v in call["arguments"].items():
                if isinstance(v, str) and v not in ROOMS and v not in MODES:
                    values.add(v.lower())
    return values, queries


def norm(text):
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).strip()


def leaks(ex, values, queries):
    q = ex["query"].lower()
    if norm(ex["query"]) in queries:
        return "query"
    for v in values:
        if re.search(r"(?<![a-z0-9])" + re.escape(v) + r"(?![a-z0-9])", q):
            return "value"
    return None


CONV_HELD_OUT = {
    "names": ["Ingrid", "Bartholomew", "Xiomara", "Thaddeus", "Philippa", "Radomir"],
    "cities": ["Reykjavik", "Ulaanbaatar", "Tbilisi", "Valparaiso", "Kraków", "Windhoek"],
    "artists": ["Sigur Ros", "Fela Kuti", "Bon Iver", "Massive Attack", "Nina Simone"],
    "labels": ["laundry soak", "bread proof", "tortellini", "sourdough"],
    "texts": ["the parcel arrived", "save me a plate", "bring the umbrella", "traffic is awful"],
    "made_up": 0.0,
}


def make_data(seed, n, conv_share, tools_by_name, banned, train_templates, mix=None):
    """`mix`: `off_topic` (share of single turns with no call), `made_up`, `markov` (slot
    values), and single_turn's `off_topic_extra`, `tool_weights`."""
    mix = mix or {}
    rng = random.Random(seed)
    values, queries = banned
    extra_banned = {v.lower() for k, vs in CONV_HELD_OUT.items() if k not in ("made_up", "markov")
                    for v in vs}
    slots = Slots(rng, values | extra_banned,
                  pools={"made_up": mix.get("made_up", 0.5), "markov": mix.get("markov", 0.0)})
    out, dropped = [], {"query": 0, "value": 0}
    while len(out) < n:
        roll = rng.random()
        if roll < conv_share:
            ex = conversation(rng, slots, tools_by_name, train_templates, mix)
        elif roll < conv_share + mix.get("structured", 0.0):
            ex = structured(rng, slots, tools_by_name, train_templates, mix)
        else:
            ex = single_turn(rng, slots, tools_by_name, train_templates,
                             p_off=mix.get("off_topic", 0.05), mix=mix)
        why = leaks(ex, values | extra_banned, queries)
        if why:
            dropped[why] += 1
            continue
        ex["tools"] = shaped_tools(rng, ex["tools"])
        if rng.random() < 0.2:
            ex["system"] = rng.choice(SYSTEMS)
        out.append(ex)
    return out, dropped


def held_out_conversations(seed, n, tools_by_name):
    """Tool loops with slot values and query phrasings no training example has, whose
    target is prose."""
    rng = random.Random(seed)
    slots = Slots(rng, set(), pools=CONV_HELD_OUT)
    templates = {t: [HELD_OUT_TEMPLATES[t]] for t in TEMPLATES}
    out = []
    while len(out) < n:
        ex = single_turn(rng, slots, tools_by_name, templates, p_two=0.25, p_off=0.0)
        results = [tool_result(rng, c, errors=0.0) for c in ex["answers"]]
        ex["turns"] = [("assistant", ex["answers"]), ("results", results)]
        ex["target"] = " ".join(prose(c, r) for c, r in zip(ex["answers"], results)) + IM_END
        if rng.random() < 0.3:
            ex["system"] = rng.choice(SYSTEMS)
        out.append(ex)
    return out


# ---------------------------------------------------------------- encoding and batches

def encode(tok, ex):
    prompt, target = render(ex)
    p, t = tok.encode(prompt), tok.encode(target)
    return [BOS] + p + t + [EOS], 1 + len(p)


BUCKETS = (384, 640, 1024)
BATCH_TOKENS = 6144


def batches(encoded, rng):
    """Length-bucketed batches of about BATCH_TOKENS tokens, shuffled."""
    by = {b: [] for b in BUCKETS}
    for ids, start in encoded:
        b = next((b for b in BUCKETS if len(ids) <= b), None)
        if b is not None:
            by[b].append((ids, start))
    out = []
    for b, items in by.items():
        rng.shuffle(items)
        size = max(1, BATCH_TOKENS // b)
        for i in range(0, len(items) - size + 1, size):
            chunk = items[i:i + size]
            ids = np.full((size, b), PAD, np.int32)
            mask = np.zeros((size, b), np.float32)
            for r, (seq, start) in enumerate(chunk):
                ids[r, :len(seq)] = seq
                mask[r, start:len(seq)] = 1.0
            out.append((ids, mask))
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------- training

def train(params, config, encoded, minutes, lr, warmup, seed, log, fixed_steps=None):
    import jax
    import jax.numpy as jnp
    import optax
    from needle.model.architecture import SimpleAttentionNetwork
    from needle.model.quantize import cq_ste_params
    model = SimpleAttentionNetwork(config)

    def loss_fn(p, ids, mask, qat):
        if qat:
            p = cq_ste_params(p, 4)
        logits = model.apply({"params": p}, ids)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:])
        m = mask[:, 1:]
        return (ce * m).sum() / jnp.maximum(m.sum(), 1.0)

    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.inject_hyperparams(optax.adamw)(learning_rate=lr, b2=0.98, weight_decay=0.01))
    state = opt.init(params)

    def step(p, s, ids, mask, lr_now, qat):
        s[1].hyperparams["learning_rate"] = lr_now
        loss, grads = jax.value_and_grad(loss_fn)(p, ids, mask, qat)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    steps = {q: jax.jit(functools.partial(step, qat=q)) for q in (False, True)}
    rng = random.Random(seed)
    queue = []
    budget = minutes * 60.0
    total = None
    t0 = time.time()
    compile_s = 0.0
    i, losses, tokens = 0, [], 0
    while total is None or i < total:
        if not queue:
            queue = batches(encoded, rng)
        ids, mask = queue.pop()
        qat = total is not None and i >= int(total * 0.75)
        if total is None:
            lr_now = lr * min(1.0, (i + 1) / warmup)
        else:
            lr_now = lr * min(1.0, (i + 1) / warmup) if i < warmup else \
                lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (i - warmup) / max(1, total - warmup))))
        ts = time.time()
        key = (qat, ids.shape)
        params, state, loss = steps[qat](params, state, jnp.asarray(ids), jnp.asarray(mask),
                                         jnp.asarray(lr_now, jnp.float32))
        loss = float(loss)
        dt = time.time() - ts
        if key not in _seen:
            _seen.add(key)
            compile_s += dt
        losses.append(loss)
        tokens += ids.size
        i += 1
        if total is None and i == 60 and fixed_steps:
            # Set where a fitted run sets it, so that the schedule is that run's.
            total = fixed_steps
            log(f"steps: {total}")
        elif total is None and i == 60:
            # Fit the budget: the rate of these steps (compiles excluded), QAT steps
            # taken as 1.4 times as slow, the QAT variant's compiles as 60 s.
            rate = (time.time() - t0 - compile_s) / i
            left = budget - (time.time() - t0) - 60.0
            total = i + int(left / (rate * (0.75 + 0.25 * 1.4)))
            log(f"fit budget: {rate:.2f} s/step -> {total} steps")
        if i % 20 == 0:
            log(f"step {i}/{total} loss {np.mean(losses[-20:]):.4f} lr {lr_now:.2e} qat {qat} "
                f"{(time.time() - t0) / 60:.1f} min")
    minutes_used = (time.time() - t0) / 60
    return params, {"steps": i, "minutes": round(minutes_used, 1), "tokens": tokens,
                    "final_loss": round(float(np.mean(losses[-50:])), 4), "lr": lr, "warmup": warmup}


_seen = set()


# ---------------------------------------------------------------- evaluation

class Greedy:
    """Greedy decoding with upstream's KV-cached forward (`decode.forward_cached`): the
    prompt prefilled right-padded to a bucket (the cache's causal mask is by position, so
    the pad is overwritten before anything reads it), then one token per step."""

    def __init__(self, params, config, tok, max_len=1024):
        import jax.numpy as jnp
        from needle.model.architecture import precompute_rope_freqs
        from needle.model.decode import decode_cfg
        self.p = {k: v for k, v in params.items()}
        self.cfg = decode_cfg(config, kv_window=0)
        self.config, self.tok, self.max_len = config, tok, max_len
        self.cos, self.sin = precompute_rope_freqs(config.d_model // config.num_heads, max_len,
                                                   config.rope_theta)
        self.jnp = jnp

    def __call__(self, prompt, max_new=128):
        import jax.numpy as jnp
        from needle.model.decode import forward_cached, init_kv_cache
        ids = [BOS] + self.tok.encode(prompt)
        n = len(ids)
        if n + 1 >= self.max_len:
            return ""
        pad = min(self.max_len, -(-n // 64) * 64)
        kc, vc = init_kv_cache(self.config, 1, self.max_len)
        hist = np.zeros((1, self.max_len), np.int32)
        hist[0, :n] = ids
        valid = jnp.ones((1, self.max_len), bool)
        toks = np.zeros((1, pad), np.int32)
        toks[0, :n] = ids
        logits, kc, vc = forward_cached(self.p, self.cfg, jnp.asarray(toks), kc, vc,
                                        jnp.asarray(0, jnp.int32), self.cos, self.sin, None, False,
                                        jnp.asarray(hist), valid, None)
        nxt = int(np.argmax(np.asarray(logits[0, n - 1])))
        out, pos = [], n
        while nxt != EOS and len(out) < max_new and pos < self.max_len:
            out.append(nxt)
            hist[0, pos] = nxt
            logits, kc, vc = forward_cached(self.p, self.cfg, jnp.asarray([[nxt]], jnp.int32), kc, vc,
                                            jnp.asarray(pos, jnp.int32), self.cos, self.sin, None, False,
                                            jnp.asarray(hist), valid, None)
            nxt = int(np.argmax(np.asarray(logits[0, -1])))
            pos += 1
        return self.tok.decode(out)


def parse_calls(text):
    m = re.search(r"<tool_call>(.*?)</tool_call>", text, re.S)
    if not m:
        return None
    try:
        return json.loads(m.group(1))
    except ValueError:
        return None


def eval_exact(gen, log):
    """Held-out exact match on eval.jsonl, as runner/demo/README.md measures it."""
    from needle.model.finetune import render_example
    hits, rows = 0, []
    for line in open(os.path.join(DEMO, "eval.jsonl")):
        ex = json.loads(line)
        prompt, _ = render_example({"query": ex["query"], "tools": ex["tools"]})
        text = gen(prompt)
        ok = parse_calls(text) == ex["answers"]
        hits += ok
        kind = ("no call" if not ex["answers"] else "two calls" if len(ex["answers"]) > 1
                else ex["answers"][0]["name"])
        rows.append({"query": ex["query"], "ok": ok, "output": text, "kind": kind,
                     "full_list": len(ex["tools"]) == 6})
    log(f"held-out exact match {hits}/{len(rows)}")
    slices = {}
    for r in rows:
        for key in (r["kind"], "full tool list" if r["full_list"] else "tool subset"):
            n, k = slices.get(key, (0, 0))
            slices[key] = (n + r["ok"], k + 1)
    log("  by slice: " + ", ".join(f"{k} {n}/{t}" for k, (n, t) in sorted(slices.items())))
    return hits, rows


def is_prose(text):
    t = text.split(IM_END)[0].strip()
    return bool(t) and "<" not in t and ">" not in t and len(t) <= 200


def eval_conversations(gen, convs, log):
    prose_n, exact_n, rows = 0, 0, []
    for ex in convs:
        prompt, target = render(ex)
        text = gen(prompt, max_new=64)
        p = is_prose(text)
        e = text.split(IM_END)[0].strip() == target[:-len(IM_END)].strip()
        prose_n += p
        exact_n += e
        rows.append({"query": ex["query"], "prose": p, "exact": e, "output": text,
                     "expected": target})
    log(f"conversations: prose {prose_n}/{len(convs)}, exact {exact_n}/{len(convs)}")
    return prose_n, exact_n, rows


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--base", default=os.path.join(DEMO, "needle-demo.cact"))
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--examples", type=int, default=16000)
    ap.add_argument("--conv-share", type=float, default=0.4)
    ap.add_argument("--minutes", type=float, default=45.0, help="training time budget")
    ap.add_argument("--steps", type=int,
                    help="train this many steps instead of fitting --minutes (a shipped "
                         "stage's count from its summary.json, to reproduce it)")
    ap.add_argument("--off-topic-share", type=float, default=0.05,
                    help="share of single-turn examples that call no tool")
    ap.add_argument("--off-topic-extra", action="store_true",
                    help="off-topic requests also naming numbers, contacts and cities")
    ap.add_argument("--made-up", type=float, default=0.5,
                    help="share of string slot values that are made up rather than from the lists")
    ap.add_argument("--markov", type=float, default=0.0,
                    help="share of made-up words drawn from a letter-trigram chain")
    ap.add_argument("--structured-share", type=float, default=0.0,
                    help="share of examples answered through response_format (one tool named "
                         "after an output model)")
    ap.add_argument("--tool-weights", default="",
                    help="e.g. send_message=1.4,play_music=1.4: how often each tool is called")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--eval-only", help="evaluate this .cact and stop")
    ap.add_argument("--interpolate", nargs=2, metavar=("A", "B"),
                    help="instead of training: the weights (1 - alpha) A + alpha B of two "
                         ".cact files fine-tuned from one another (read back dequantized), "
                         "exported, evaluated and (with --ship) shipped")
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--ship", action="store_true",
                    help="replace runner/demo/needle-demo.cact if the candidate passes")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    logf = open(os.path.join(args.work, "log.txt"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    tools = json.load(open(os.path.join(DEMO, "tools.json")))
    tools_by_name = {t["name"]: t for t in tools}
    convs = held_out_conversations(args.seed + 7, 50, tools_by_name)

    def evaluate(path, tag):
        params, config, blob = load_cact(path, args.max_seq_len)
        gen = Greedy(params, config, Tokenizer(blob))
        t = time.time()
        hits, rows = eval_exact(gen, log)
        p, e, crow = eval_conversations(gen, convs, log)
        log(f"[{tag}] eval {time.time() - t:.0f} s")
        json.dump({"exact": hits, "prose": p, "prose_exact": e, "rows": rows, "conversations": crow},
                  open(os.path.join(args.work, f"eval_{tag}.json"), "w"), indent=1)
        return hits, p, e

    if args.eval_only:
        evaluate(args.eval_only, "only")
        return

    if args.interpolate:
        import jax
        pa, config, blob = load_cact(args.interpolate[0], args.max_seq_len)
        pb, _, blob_b = load_cact(args.interpolate[1], args.max_seq_len)
        assert blob == blob_b, "the two files have different tokenizers"
        params = jax.tree.map(lambda a, b: (1 - args.alpha) * a + args.alpha * b, pa, pb)
        stats = {"interpolate": args.interpolate, "alpha": args.alpha}
        log(f"interpolated {args.interpolate}, alpha {args.alpha}")
        return export_and_evaluate(args, params, config, blob, Tokenizer(blob), stats, convs,
                                   evaluate, log)

    params, config, blob = load_cact(args.base, args.max_seq_len)
    tok = Tokenizer(blob)
    banned = held_out_values()
    train_templates = {t: [x for x in ts if x != HELD_OUT_TEMPLATES[t]] for t, ts in TEMPLATES.items()}
    mix = {"off_topic": args.off_topic_share, "off_topic_extra": args.off_topic_extra,
           "made_up": args.made_up, "markov": args.markov, "structured": args.structured_share,
           "tool_weights": {k: float(v) for k, v in
                            (kv.split("=") for kv in args.tool_weights.split(",") if kv)}}
    log(f"args: {vars(args)}")
    data, dropped = make_data(args.seed, args.examples, args.conv_share, tools_by_name, banned,
                              train_templates, mix)
    log(f"data: {len(data)} examples, dropped {dropped} (held-out query / slot value)")
    singles = [ex for ex in data if "turns" not in ex]
    calls = {}
    for ex in data:
        for c in ex["answers"]:
            calls[c["name"]] = calls.get(c["name"], 0) + 1
    log(f"single turns {len(singles)}, of which off-topic {sum(not ex['answers'] for ex in singles)}; "
        f"calls per tool {calls}")
    # Independent leak check on the rendered text.
    text_leaks = sum(1 for ex in data if leaks(ex, banned[0], banned[1]))
    log(f"leak check: {text_leaks} training examples name a held-out value or query")
    for ex in random.Random(1).sample(data, 200):
        p, _ = render(ex)
        assert tok.encode(p) == tok.ref.encode(p), "cached encoding differs from RefTokenizer"
    encoded = [encode(tok, ex) for ex in data]
    lens = np.array([len(e[0]) for e in encoded])
    log(f"tokens per example: median {int(np.median(lens))}, max {lens.max()}, "
        f"> 1024: {(lens > 1024).sum()}; conversations {sum('turns' in ex for ex in data)}")
    with open(os.path.join(args.work, "train.jsonl"), "w") as f:
        for ex in data:
            f.write(json.dumps(ex, ensure_ascii=False) + "\n")

    params, stats = train(params, config, encoded, args.minutes, args.lr, args.warmup, args.seed, log,
                          fixed_steps=args.steps)
    stats.update(examples=len(data), dropped=dropped)
    export_and_evaluate(args, params, config, blob, tok, stats, convs, evaluate, log)


def export_and_evaluate(args, params, config, blob, tok, stats, convs, evaluate, log):
    pickle.dump(params, open(os.path.join(args.work, "params.pkl"), "wb"))
    from needle.model.export import write_export, read_export
    cand = os.path.join(args.work, "needle-demo.cact")
    info = write_export(params, config, cand, bits=4, group=128, tokenizer=tok, kv_window=0)
    read_export(cand)
    assert load_cact(cand, args.max_seq_len)[2] == blob, "tokenizer blob changed"
    log(f"exported {info}")
    hits, p, e = evaluate(cand, "candidate")
    stats.update(exact=hits, prose=p, prose_exact=e)
    json.dump(stats, open(os.path.join(args.work, "summary.json"), "w"), indent=1)
    log(json.dumps(stats))
    passed = hits >= 62 and p >= 0.75 * len(convs)
    log(f"passed: {passed}")
    if args.ship and passed:
        import shutil
        shutil.copyfile(cand, os.path.join(DEMO, "needle-demo.cact"))
        log("shipped runner/demo/needle-demo.cact")


if __name__ == "__main__":
    main()
