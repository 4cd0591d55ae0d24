#!/usr/bin/env python
"""Decode rate of the accelerator graphs (`needle-run --graph accelerator`) against the
stock graph needle-run runs on the CPU (fused, packed weights, cache updated in place),
at about 64 and 1024 past tokens, one thread, on the CPU EP.

    python bench/accelerator_decode.py NEEDLE_RUN MODEL.cact [RUNS]

Each measurement is `needle-run --raw TEXT --json --max-new-tokens 16` with a prompt of
about the past length (its `decode_tps`: the 16 cached decode steps after it), through
the graph cache (a first unmeasured run exports the graphs into a scratch cache), RUNS
times (default 3); prints the median of each as one JSON object.
"""
import json
import statistics
import subprocess
import sys
import tempfile

NEW_TOKENS = 16


def prompt_of(needle_run, model, env, tokens):
    """A raw prompt of at least `tokens` tokens ([BOS] included)."""
    words = ["turn", "off", "the", "lights", "in", "kitchen", "and", "set", "a", "timer"]
    sample = " ".join(words * 4)
    per_word = len(run(needle_run, model, env, sample, "stock")["prompt_ids"]) / len(words * 4)
    # As many words as the tokens they take (a random model's vocabulary splits them finely).
    count = max(1, int(tokens / per_word))
    return " ".join(words[i % len(words)] for i in range(count))


def run(needle_run, model, env, text, graph):
    cmd = [needle_run, "--model", model, "--provider", "cpu", "--threads", "1",
           "--graph", graph, "--raw", text, "--json", "--max-new-tokens", str(NEW_TOKENS)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main(needle_run, model, runs="3"):
    cache = tempfile.mkdtemp(prefix="needle-accel-bench-")
    env = {"NEEDLE_ONNX_CACHE": cache, "PATH": "/usr/bin:/bin"}
    report = {"model": model, "runs": int(runs), "new_tokens": NEW_TOKENS, "decode_tps": {}}
    for past in (64, 1024):
        text = prompt_of(needle_run, model, env, past)
        for graph in ("stock", "accelerator"):
            run(needle_run, model, env, text, graph)
            rates = [run(needle_run, model, env, text, graph) for _ in range(int(runs))]
            key = f"{graph}@{len(rates[0]['prompt_ids'])}"
            report["decode_tps"][key] = statistics.median(r["decode_tps"] for r in rates)
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
