"""An accelerator graph pair (`needle-export --target`) against upstream, on the CPU EP.

Usage: accelerator_run.py DECODE.onnx PREFILL.onnx CASES.safetensors [GENERATE.json]

Drives the graphs the way their interface says (graphs/src/accelerator/mod.rs): a cache of
fixed capacity owned here, each call's `new_key_values.*` written into it at the tokens'
positions (a ring, when the graph takes `cache_positions`: position p in slot p mod the
capacity, `cache_positions` saying which position each slot holds), `attention_mask`
marking the filled slots, `token_window` the row's last W
tokens before the call then the call's own (a final prefill chunk padded with zeros), and
Needle 3's QKV-conv state: the row's last raw projections each call returned.

1. Every row of every upstream case twice: whole through the prefill graph (in chunks,
   the last one partial: `<case>[<row>].prefill`), and its first tokens through the
   prefill graph then the rest one token a step through the decode graph (40 steps, or
   all but the first token for shorter rows: `<case>[<row>].cached`); logits at every
   real position against upstream's, the contract's rule: max|got − ref| / max(1, max|ref|).
2. Every upstream greedy generation: the prompt through the prefill graph, then greedy
   decode steps until EOS (id 1) or as many tokens as upstream generated.

Prints one JSON object: `{"cases": {"<run>": error}, "prefill_chunks": {"<run>": chunks},
"decode_steps": {"<run>": steps}, "generations": [{"expected": [...], "got": [...]}],
"ring_slots": slots or null}`.
"""
import json
import sys

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file

EOS = 1
FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
DECODE_STEPS = 40


class Session:
    def __init__(self, path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i.shape for i in self.session.get_inputs()}
        # float32, or float16 for a `--precision fp16` graph: the cache and mask's type.
        self.float = FLOAT_TYPES[{i.name: i.type for i in self.session.get_inputs()}["attention_mask"]]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.window = self.inputs["token_window"][1]
        self.sequence = self.inputs["position_ids"][1]
        self.history = self.window - self.sequence
        self.ring = "cache_positions" in self.inputs
        # A ring's slots are fewer than the positions the model takes (RoPE's table).
        meta = self.session.get_modelmeta().custom_metadata_map
        self.max_positions = int(meta["needle.max_seq_len"])


class Row:
    """One row's fixed-capacity cache and its tokens so far."""

    def __init__(self, decode):
        self.pasts = {n: np.zeros(s, decode.float) for n, s in decode.inputs.items()
                      if n.startswith("past_key_values.")}
        self.capacity = decode.inputs["attention_mask"][1]
        self.mask = np.zeros((1, self.capacity), decode.float)
        self.ring = decode.ring
        self.slot_positions = np.zeros((1, self.capacity), np.int32)
        self.max_positions = decode.max_positions
        self.tokens = []

    def slots(self, p0, n):
        """Each of a call's `n` tokens' slot, in order (a ring: later ones replace earlier)."""
        return [(p0 + i) % self.capacity if self.ring else p0 + i for i in range(n)]

    def call(self, graph, tokens):
        """Runs `tokens` (at most the graph's sequence) through `graph`; their logits."""
        p0, n, s = len(self.tokens), len(tokens), graph.sequence
        before = ([0] * graph.history + self.tokens)[-graph.history:] if graph.history else []
        window = before + list(tokens) + [0] * (s - n)
        positions = [min(p0 + i, self.max_positions - 1) for i in range(s)]
        feeds = dict(self.pasts)
        feeds["token_window"] = np.array([window], np.int32)
        feeds["position_ids"] = np.array([positions], np.int32)
        feeds["attention_mask"] = self.mask
        if self.ring:
            feeds["cache_positions"] = self.slot_positions
        result = dict(zip(graph.outputs, graph.session.run(graph.outputs, feeds)))
        for name, value in result.items():
            if not name.startswith("new_key_values."):
                continue
            past = "past_key_values." + name[len("new_key_values."):]
            if name.endswith(".qkv_conv"):
                # Needle 3's conv state: the row's last `slots` raw projections.
                slots = self.pasts[past].shape[1]
                rows = np.concatenate([self.pasts[past], value[:, :n]], axis=1)
                self.pasts[past] = rows[:, -slots:]
            else:
                for i, slot in enumerate(self.slots(p0, n)):
                    self.pasts[past][:, :, slot] = value[:, :, i]
        for i, slot in enumerate(self.slots(p0, n)):
            self.mask[0, slot] = 1
            self.slot_positions[0, slot] = p0 + i
        self.tokens.extend(tokens)
        return result["logits"][0, :n]

    def prefill(self, graph, tokens):
        chunks = [tokens[i:i + graph.sequence] for i in range(0, len(tokens), graph.sequence)]
        return np.concatenate([self.call(graph, c) for c in chunks]), len(chunks)


def relative_error(got, ref):
    return float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))


def main(decode_path, prefill_path, cases_path, generate_path=None):
    decode, prefill = Session(decode_path), Session(prefill_path)
    cases = load_file(cases_path)
    report = {"cases": {}, "prefill_chunks": {}, "decode_steps": {}, "generations": [],
              "ring_slots": decode.inputs["attention_mask"][1] if decode.ring else None}
    for name in sorted(k[:-len(".input_ids")] for k in cases if k.endswith(".input_ids")):
        if name + ".logits" not in cases:
            continue
        ids, lengths, ref = (cases[f"{name}.{k}"] for k in ("input_ids", "lengths", "logits"))
        for b, length in enumerate(lengths):
            tokens = [int(t) for t in ids[b, :length]]
            for run, steps in [("prefill", 0), ("cached", min(len(tokens) - 1, DECODE_STEPS))]:
                row = Row(decode)
                got, chunks = row.prefill(prefill, tokens[:len(tokens) - steps])
                got = [got] + [row.call(decode, [t]) for t in tokens[len(tokens) - steps:]]
                key = f"{name}[{b}].{run}"
                report["cases"][key] = relative_error(np.concatenate(got), ref[b, :length])
                report["prefill_chunks"][key] = chunks
                report["decode_steps"][key] = steps
    if generate_path:
        for reference in json.load(open(generate_path)):
            row = Row(decode)
            logits, _ = row.prefill(prefill, reference["prompt_ids"])
            generated = []
            next_id = int(np.argmax(logits[-1]))
            while len(generated) < len(reference["generated_ids"]) and next_id != EOS:
                generated.append(next_id)
                next_id = int(np.argmax(row.call(decode, [next_id])[-1]))
            report["generations"].append(
                {"expected": reference["generated_ids"], "got": generated})
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
