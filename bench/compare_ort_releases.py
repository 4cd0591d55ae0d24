#!/usr/bin/env python3
"""Whole-process needle-run under two onnxruntime libraries, same graphs, interleaved.

    python3 bench/compare_ort_releases.py NEEDLE_RUN DIR ROUNDS NAME=LIBRARY NAME=LIBRARY

DIR holds `needle-export --attention both` graphs of the demo model (`demo.onnx`,
`demo.reference.onnx`) and of the Needle 3 fixture n3a (`n3a.onnx`, `n3a.reference.onnx`).
Each round runs every graph once under every library (ORT_DYLIB_PATH), in an order that
alternates between rounds, each run under `/usr/bin/time -v`, 1 thread: the demo answers its
tool query (`--query`, 222 prompt tokens), n3a continues a 41-token raw prompt for 120 tokens (random
weights, no EOS). Prints one markdown row per graph and library: the median and the range
(min–max) over the rounds of the process's wall time, needle-run's prefill and decode rates,
and the process's peak RSS.
"""
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N3A_PROMPT = "set a timer for five minutes and turn off the kitchen lights"


def cases(folder):
    tools = os.path.join(ROOT, "runner/demo/tools.json")
    demo = ["--tools", tools, "--query", "turn off the kitchen lights"]
    n3a = ["--raw", N3A_PROMPT, "--max-new-tokens", "120", "--json"]
    return [
        ("demo fused", [os.path.join(folder, "demo.onnx")] + demo),
        ("demo reference", [os.path.join(folder, "demo.reference.onnx")] + demo),
        ("n3a fused", [os.path.join(folder, "n3a.onnx")] + n3a),
        ("n3a reference", [os.path.join(folder, "n3a.reference.onnx")] + n3a),
    ]


def run(needle_run, library, model_and_args):
    model, *args = model_and_args
    env = dict(os.environ, ORT_DYLIB_PATH=library)
    cmd = ["/usr/bin/time", "-v", needle_run, "--model", model, "--threads", "1", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout.splitlines()[0])
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    hours, minutes, seconds = wall.groups()
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return {
        "wall_s": int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds),
        "prefill_tps": answer["prefill_tps"],
        "decode_tps": answer["decode_tps"],
        "rss_mib": rss_kb / 1024,
    }


def main(needle_run, folder, rounds, *libraries):
    libraries = [spec.split("=", 1) for spec in libraries]
    results = {}
    for r in range(int(rounds)):
        order = libraries if r % 2 == 0 else libraries[::-1]
        for name, args in cases(folder):
            for release, library in order:
                results.setdefault((name, release), []).append(run(needle_run, library, args))
        print(f"round {r + 1} done", file=sys.stderr)
    print("| graph | onnxruntime | wall, s | prefill, tok/s | decode, tok/s | peak RSS, MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for (name, release), runs in results.items():
        cells = []
        for key, digits in [("wall_s", 3), ("prefill_tps", 0), ("decode_tps", 0), ("rss_mib", 1)]:
            values = [run[key] for run in runs]
            cells.append(f"{statistics.median(values):.{digits}f} "
                         f"({min(values):.{digits}f}–{max(values):.{digits}f})")
        print(f"| {name} | {release} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
