"""Stock-deployment check of an exported Needle graph, independent of our Rust code.

Usage: check_onnx.py MODEL.onnx CASES.safetensors [KERNEL_LIBRARY]

1. `onnx.checker.check_model(full_check=True)` on the file;
2. loads it in Python onnxruntime (CPU; custom ops only from KERNEL_LIBRARY, the Needle
   kernel library, where given: `register_custom_ops_library`) and feeds every case of
   the upstream fixture (`X.input_ids`, all-ones attention_mask, positions 0..S-1,
   empty pasts: zero-length KV, zero engram state);
3. runs each case's first row again through the KV cache: its first half (at least one
   token) as one prefill, then one token per step, every present.X fed back as
   past_key_values.X and present_X as past_X (so a sliding window is checked in decode
   too);
4. prints one JSON line: per case (and per case's cached run, `<case>.cached`), the max
   over rows of max|got - ref| / max(1, max|ref|) over the row's real positions; the
   operator domains the graph's nodes use ("" is ai.onnx); and the op types the session
   runs and the initializers it keeps after onnxruntime's graph optimizations (its
   fusions and constant folding).
"""
import json
import os
import sys
import tempfile

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


def cached_run(sess, ids):
    """Logits [len(ids), vocab] of one row: its first half in one call, then a token a step."""
    feeds = empty_feeds(sess, 1)
    outputs = [o.name for o in sess.get_outputs()]
    prefill = max(1, len(ids) // 2)
    chunks = [ids[:prefill]] + [ids[t:t + 1] for t in range(prefill, len(ids))]
    past, logits = 0, []
    for chunk in chunks:
        feeds["input_ids"] = np.array([chunk], np.int64)
        feeds["attention_mask"] = np.ones((1, past + len(chunk)), np.int64)
        feeds["position_ids"] = np.arange(past, past + len(chunk), dtype=np.int64)[None]
        result = dict(zip(outputs, sess.run(outputs, feeds)))
        logits.append(result["logits"][0])
        for name, value in result.items():
            if name.startswith("present."):
                feeds["past_key_values." + name[len("present."):]] = value
            elif name.startswith("present_"):
                feeds["past_" + name[len("present_"):]] = value
        past += len(chunk)
    return np.concatenate(logits)


def relative_error(got, ref):
    return float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))


def main(model_path, cases_path, kernel_library=None):
    onnx.checker.check_model(model_path, full_check=True)
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        options.log_severity_level = 3  # not the warning that the file is for this machine
        if kernel_library:
            options.register_custom_ops_library(kernel_library)
        sess = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        # Only its nodes and initializer names are read: an initializer it keeps from an
        # external-data graph still names the data file beside the original.
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
        session_ops = sorted({n.op_type for n in optimized.node})
        session_initializers = sorted(t.name for t in optimized.initializer)
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
        errors[name] = max(relative_error(got[b, :n], ref[b, :n]) for b, n in enumerate(lengths))
        n = lengths[0]
        errors[f"{name}.cached"] = relative_error(cached_run(sess, ids[0, :n]), ref[0, :n])
    domains = sorted({n.domain for n in onnx.load(model_path).graph.node})
    print(json.dumps({"model": model_path, "max_rel_error": errors, "node_domains": domains,
                      "session_ops": session_ops, "session_initializers": session_initializers}))


if __name__ == "__main__":
    main(*sys.argv[1:])
