"""Exploration for issue 5: what would keeping the CQ weights compressed inside the ONNX
graph cost? Builds, from a `.cact`, a graph in which every 4-bit CQ matrix is stored as
its packed codes + fp16 group norms + the shared codebook and dequantized by ai.onnx ops
(BitwiseAnd/BitShift unpack, Gather from the codebook, scale by the norm, MatMul with the
group's Walsh-Hadamard matrix, Slice off the padding), each feeding one MatMul of a graph
input the way the model's projections use them; and the same graph with the float
weights stored instead. onnxruntime constant-folds the dequantization when it creates the
session, so it shows up as load time and memory, not per token.

Prints one JSON line: file sizes, session creation time and peak RSS of a process that
creates each session (best of 3, each in a fresh process), and the largest difference of
the in-graph dequantization from upstream `read_export` (the float32 weights).

Usage: .venv/bin/python bench/cq_in_graph.py target/bench/needle-base.cact
"""

import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from needle.model import export as cact_export
from needle.model.quantize import _cq_codebook_np, _cq_hadamard_np


def cq_entries(path):
    """(name-less index, shape, packed codes, fp16 norms, group) of each 4-bit CQ tensor,
    the float tensors, and upstream's own decoding of every tensor."""
    raw = open(path, "rb").read()
    hdr = struct.unpack_from(cact_export._HDR_FMT, raw, 0)
    num_tensors, cb_n = hdr[1], hdr[2]
    off = struct.calcsize(cact_export._HDR_FMT) + cb_n * 4
    cq, other_bytes = [], 0
    for i in range(num_tensors):
        rec = struct.unpack(cact_export._REC_FMT, raw[off:off + cact_export.REC_SIZE])
        off += cact_export.REC_SIZE
        dtype, ndim = rec[0], rec[1]
        shape = tuple(rec[3:3 + ndim])
        offset, nbytes, group, bits = rec[7], rec[8], rec[9], rec[10]
        blob = raw[offset:offset + nbytes]
        if dtype == cact_export.CQ and bits == 4:
            out, in_dim = shape
            in_pad = (in_dim + group - 1) // group * group
            n_packed = out * in_pad // 2
            packed = np.frombuffer(blob[:n_packed], np.uint8).reshape(out, in_pad // 2)
            norms = np.frombuffer(blob[n_packed:], np.float16).reshape(out, in_pad // group)
            cq.append((i, shape, packed, norms, group))
        else:
            other_bytes += nbytes
    _, upstream = cact_export.read_export(path)
    return cq, other_bytes, upstream


def build(cq, upstream, compressed):
    nodes, inits, inputs, outputs = [], [], [], []
    shared = {}

    def const(name, array):
        if name not in shared:
            inits.append(numpy_helper.from_array(array, name))
            shared[name] = name
        return name

    const("shift4", np.array(4, np.uint8))
    const("mask4", np.array(15, np.uint8))
    for i, (idx, (out, in_dim), packed, norms, group) in enumerate(cq):
        t = f"t{i}"
        if compressed:
            in_pad = packed.shape[1] * 2
            cb = const(f"codebook4_{group}", _cq_codebook_np(4, group).astype(np.float32))
            h = const(f"hadamard_{group}", _cq_hadamard_np(group).astype(np.float32))
            groups_shape = const(f"shape_{out}_{in_pad}_{group}",
                                 np.array([out, in_pad // group, group], np.int64))
            flat_shape = const(f"shape_{out}_{in_pad}", np.array([out, in_pad], np.int64))
            inits.append(numpy_helper.from_array(packed, f"{t}.codes"))
            inits.append(numpy_helper.from_array(
                norms.reshape(out, in_pad // group, 1), f"{t}.norms"))
            nodes += [
                helper.make_node("BitwiseAnd", [f"{t}.codes", "mask4"], [f"{t}.lo"]),
                helper.make_node("BitShift", [f"{t}.codes", "shift4"], [f"{t}.hi"],
                                 direction="RIGHT"),
                helper.make_node("Unsqueeze", [f"{t}.lo", "axis2"], [f"{t}.lo3"]),
                helper.make_node("Unsqueeze", [f"{t}.hi", "axis2"], [f"{t}.hi3"]),
                helper.make_node("Concat", [f"{t}.lo3", f"{t}.hi3"], [f"{t}.pairs"], axis=2),
                helper.make_node("Reshape", [f"{t}.pairs", flat_shape], [f"{t}.idx8"]),
                helper.make_node("Cast", [f"{t}.idx8"], [f"{t}.idx"], to=TensorProto.INT32),
                helper.make_node("Gather", [cb, f"{t}.idx"], [f"{t}.unit"]),
                helper.make_node("Reshape", [f"{t}.unit", groups_shape], [f"{t}.groups"]),
                helper.make_node("Cast", [f"{t}.norms"], [f"{t}.norms32"],
                                 to=TensorProto.FLOAT),
                helper.make_node("Mul", [f"{t}.groups", f"{t}.norms32"], [f"{t}.scaled"]),
                helper.make_node("MatMul", [f"{t}.scaled", h], [f"{t}.rot"]),
                helper.make_node("Reshape", [f"{t}.rot", flat_shape], [f"{t}.padded"]),
                helper.make_node("Slice", [f"{t}.padded", "zero", const(f"end_{in_dim}",
                                 np.array([in_dim], np.int64)), "one"], [f"{t}.w"]),
            ]
        else:
            inits.append(numpy_helper.from_array(upstream[idx].astype(np.float32), f"{t}.w"))
        nodes += [
            helper.make_node("Transpose", [f"{t}.w"], [f"{t}.wt"], perm=[1, 0]),
            helper.make_node("MatMul", [f"x{in_dim}", f"{t}.wt"], [f"y{i}"]),
        ]
        if f"x{in_dim}" not in [v.name for v in inputs]:
            inputs.append(helper.make_tensor_value_info(f"x{in_dim}", TensorProto.FLOAT,
                                                        [1, in_dim]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, out]))
    const("axis2", np.array([2], np.int64))
    const("zero", np.array([0], np.int64))
    const("one", np.array([1], np.int64))
    graph = helper.make_graph(nodes, "cq", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


CHILD = """
import resource, sys, time, json
import numpy as np, onnxruntime as ort
t = time.perf_counter()
o = ort.SessionOptions(); o.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
load = time.perf_counter() - t
feeds = {i.name: np.ones(i.shape, np.float32) for i in s.get_inputs()}
ys = s.run(None, feeds)
print(json.dumps({"load_s": load, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ys": [y.tolist() for y in ys] if len(sys.argv) > 2 else None}))
"""


def measure(path, want_outputs=False):
    best = None
    for _ in range(3):
        args = [sys.executable, "-c", CHILD, path] + (["ys"] if want_outputs else [])
        r = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
        if best is None or r["load_s"] < best["load_s"]:
            best = r
    return best


def main():
    cact = sys.argv[1]
    cq, other_bytes, upstream = cq_entries(cact)
    result = {"cact_mb": os.path.getsize(cact) / 1e6, "cq_4bit_tensors": len(cq),
              "other_tensor_mb": other_bytes / 1e6}
    with tempfile.TemporaryDirectory() as d:
        outs = {}
        for kind in ("float", "compressed"):
            path = os.path.join(d, f"{kind}.onnx")
            onnx.save(build(cq, upstream, kind == "compressed"), path)
            m = measure(path, want_outputs=True)
            outs[kind] = m.pop("ys")
            result[kind] = {"file_mb": os.path.getsize(path) / 1e6, **m}
        diff = max(float(np.max(np.abs(np.array(a) - np.array(b))) /
                       max(1.0, float(np.max(np.abs(np.array(b))))))
                   for a, b in zip(outs["compressed"], outs["float"]))
        result["max_rel_diff_of_products"] = diff
    print(json.dumps(result))


if __name__ == "__main__":
    main()
