"""Stock-deployment check of an exported Needle graph, independent of our Rust code.

Usage: check_onnx.py MODEL.onnx CASES.safetensors

1. `onnx.checker.check_model(full_check=True)` on the file;
2. loads it in Python onnxruntime (CPU, no custom ops) and feeds every case of the
   upstream fixture (`X.input_ids`, all-ones attention_mask, positions 0..S-1,
   empty pasts: zero-length KV, zero engram state);
3. prints one JSON line: per case, the max over rows of
   max|got - ref| / max(1, max|ref|) over the row's real positions; and the
   operator domains the graph's nodes use ("" is ai.onnx).
"""
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
from safetensors.numpy import load_file


def empty_feeds(sess, batch):
    feeds = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            shape = [batch if d == "batch" else 0 if d == "past_sequence" else d for d in i.shape]
            dtype = np.int64 if i.type == "tensor(int64)" else (
                np.float16 if i.type == "tensor(float16)" else np.float32)
            feeds[i.name] = np.zeros(shape, dtype)
    return feeds


def main(model_path, cases_path):
    onnx.checker.check_model(model_path, full_check=True)
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    cases = load_file(cases_path)
    errors = {}
    # Needle 3's head cases have head outputs instead of logits.
    for name in sorted({k.split(".")[0] for k in cases if k.endswith(".logits")}):
        ids = cases[f"{name}.input_ids"].astype(np.int64)
        lengths = cases[f"{name}.lengths"]
        ref = cases[f"{name}.logits"]
        feeds = empty_feeds(sess, ids.shape[0])
        feeds["input_ids"] = ids
        feeds["attention_mask"] = np.ones_like(ids)
        feeds["position_ids"] = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape).copy()
        got = sess.run(["logits"], feeds)[0]
        worst = 0.0
        for b, n in enumerate(lengths):
            r, g = ref[b, :n], got[b, :n]
            worst = max(worst, float(np.abs(g - r).max() / max(1.0, np.abs(r).max())))
        errors[name] = worst
    domains = sorted({n.domain for n in onnx.load(model_path).graph.node})
    print(json.dumps({"model": model_path, "max_rel_error": errors, "node_domains": domains}))


if __name__ == "__main__":
    main(*sys.argv[1:])
