#!/usr/bin/env python3
"""What recomputing Needle 3's QKV-conv state would cost a decode step, on the stock graph.

    .venv/bin/python bench/needle3_recompute_cost.py MODEL.onnx [PAST ...]

A graph that carried no conv state (so that onnxruntime-genai's `rewind_to`, which crops only
KV-cache pairs, could rewind it) would recompute it every step: the top layer's conv needs
the raw projections of the last `taps − 1` positions, which need the layer's input there,
which needs the layer below's conv over `taps − 1` positions more, and so on down to the
embedding. Layer `l` of `L` then runs its block on `(L − 1 − l)(taps − 1) + 1` rows, on
average `(L − 1)(taps − 1) / 2 + 1`. This times a stock-graph call of that many new rows
against a call of one row, both after the same `PAST`-token prefill (1 thread, cache copied
in and out the same way for both), interleaved, seven times each; prints the medians.
"""
import statistics
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort


def empty_pasts(sess):
    feeds = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            shape = [1 if d == "batch" else 0 if d == "past_sequence" else d for d in i.shape]
            feeds[i.name] = np.zeros(shape, np.float32)
    return feeds


def call(sess, outputs, pasts, ids, past_len):
    feeds = dict(pasts)
    feeds["input_ids"] = np.array([ids], np.int64)
    feeds["attention_mask"] = np.ones((1, past_len + len(ids)), np.int64)
    feeds["position_ids"] = np.arange(past_len, past_len + len(ids), dtype=np.int64)[None]
    start = time.perf_counter()
    result = dict(zip(outputs, sess.run(outputs, feeds)))
    return time.perf_counter() - start, result


def main(model, *pasts):
    meta = {p.key: p.value for p in onnx.load(model, load_external_data=False).metadata_props}
    layers, taps = int(meta["needle.num_layers"]), int(meta["needle.qkv_conv_taps"])
    rows = (layers - 1) * (taps - 1) // 2 + 1
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(0)
    vocab = int(meta["needle.vocab_size"])
    print(f"{layers} layers, {taps} taps: the recomputing step runs {rows} rows a layer on average")
    for past_len in [int(p) for p in pasts] or [64, 1024]:
        prompt = rng.integers(4, min(vocab, 1000), past_len).tolist()
        _, result = call(sess, outputs, empty_pasts(sess), prompt, 0)
        cache = {"past_key_values." + n[len("present."):]: v
                 for n, v in result.items() if n.startswith("present.")}
        times = {1: [], rows: []}
        for _ in range(7):
            for k in times:
                ids = rng.integers(4, min(vocab, 1000), k).tolist()
                times[k].append(call(sess, outputs, cache, ids, past_len)[0])
        one, many = statistics.median(times[1]), statistics.median(times[rows])
        print(f"past {past_len}: 1 row {one * 1e3:.1f} ms, {rows} rows {many * 1e3:.1f} ms, "
              f"{many / one:.2f}x")


if __name__ == "__main__":
    main(*sys.argv[1:])
