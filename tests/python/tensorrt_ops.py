"""Every op, attribute and tensor type of ONNX graphs against TensorRT's ONNX parser's
operator support list (tests/fixtures/tensorrt/operators-<release>.tsv, from onnx-tensorrt's
docs/operators.md), and where the ops it lacks sit (exporter/tests/accelerator.rs runs it).

    python tensorrt_ops.py OPERATORS.tsv GRAPH.onnx...

Prints JSON, per graph: the opset, the ops and the attributes each uses, the nodes TensorRT
lacks an op for, type and restriction violations (those nodes are left out of TensorRT's
share too), the edge (the left-out nodes and every node they read from) and how many
connected islands the rest, TensorRT's share, forms.
"""

import json
import sys
from collections import Counter, defaultdict

import onnx
from onnx import TensorProto, numpy_helper, shape_inference

TYPE_NAMES = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.INT8: "INT8",
    TensorProto.UINT8: "UINT8",
    TensorProto.BOOL: "BOOL",
    TensorProto.DOUBLE: "DOUBLE",
}

REDUCE = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
          "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"}


def read_support(path):
    support, opset = {}, None
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "opset":
            opset = (int(fields[1]), int(fields[2]))
        else:
            support[fields[0]] = (fields[1] == "Y", set(fields[2].split()) if len(fields) > 2 else set())
    return support, opset


def restriction(node, constant):
    """The onnx-tensorrt restriction (its table's wording) `node` breaks, or None."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    if op in REDUCE and len(node.input) > 1 and node.input[1] and node.input[1] not in constant:
        return "`axes` must be an initializer"
    if op in ("Squeeze", "Unsqueeze") and len(node.input) > 1 and node.input[1] not in constant:
        return "`axes` must be resolvable to a constant"
    if op == "CumSum" and node.input[1] not in constant:
        return "`axis` must be a build-time constant"
    if op == "TopK" and attrs.get("sorted", 1) != 1:
        return "`sorted` must be 1"
    if op == "ScatterND" and attrs.get("reduction", b"none") not in (b"none", "none"):
        return "`reduction` other than `none` is not supported"
    if op == "LayerNormalization" and len([o for o in node.output if o]) > 1:
        return "Only the first output `Y` is supported"
    if op == "Constant" and any(k in attrs for k in ("sparse_value", "value_string", "value_strings")):
        return "`sparse_value`, `value_string`, and `value_strings` attributes are unsupported"
    if op == "Dropout" and len(node.input) > 2 and node.input[2]:
        return "`is_training` must be an initializer and evaluate to False"
    return None


def check(path, support, opset_range):
    model = shape_inference.infer_shapes(onnx.load(path), strict_mode=True)
    graph = model.graph
    types = {}
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        types[v.name] = v.type.tensor_type.elem_type
    for t in graph.initializer:
        types[t.name] = t.data_type
    constant = {t.name for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            constant.update(n.output)
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                types[n.output[0]] = value.data_type
    opsets = {o.domain or "": o.version for o in model.opset_import}
    report = {
        "opset": opsets.get(""),
        "other_domains": sorted(d for d in opsets if d not in ("", "ai.onnx")),
        "functions": len(model.functions),
        "nodes": len(graph.node),
        "ops": {},
        "attributes": {},
        "unsupported": [],
        "type_violations": [],
        "restriction_violations": [],
    }
    ops, attributes = Counter(), defaultdict(set)
    producer = {}
    unsupported = set()
    for i, n in enumerate(graph.node):
        ops[n.op_type] += 1
        attributes[n.op_type].update(a.name for a in n.attribute)
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            report["restriction_violations"].append(f"{n.name}: {n.op_type} has a subgraph")
        for o in n.output:
            producer[o] = i
        known, types_ok = support.get(n.op_type, (False, set()))
        if n.domain not in ("", "ai.onnx") or not known:
            unsupported.add(i)
            report["unsupported"].append(f"{n.name or i}: {n.domain or 'ai.onnx'}.{n.op_type}")
            continue
        # The table's types are what an op takes: its inputs' (a comparison's output is BOOL).
        for name in [x for x in n.input if x]:
            kind = TYPE_NAMES.get(types.get(name), f"type {types.get(name)}")
            if kind not in types_ok:
                unsupported.add(i)
                report["type_violations"].append(f"{n.name or i}: {n.op_type} on {kind} ({name})")
        why = restriction(n, constant)
        if why:
            unsupported.add(i)
            report["restriction_violations"].append(f"{n.name or i}: {n.op_type}: {why}")
    report["left_out"] = len(unsupported)
    report["ops"] = dict(sorted(ops.items()))
    report["attributes"] = {op: sorted(a) for op, a in sorted(attributes.items()) if a}
    # The edge: the left-out nodes and everything they read, computed. onnxruntime can run it
    # on another EP at the graph's start only if it is small and TensorRT takes the rest as one
    # island (a left-out node inside the float blocks would pull most of the graph in).
    edge, todo = set(), list(unsupported)
    while todo:
        i = todo.pop()
        if i in edge:
            continue
        edge.add(i)
        todo.extend(producer[x] for x in graph.node[i].input if x in producer)
    parent = {i: i for i in range(len(graph.node)) if i not in edge}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, n in enumerate(graph.node):
        if i in edge:
            continue
        for x in n.input:
            j = producer.get(x)
            if j is not None and j not in edge:
                parent[root(i)] = root(j)
    report["edge_nodes"] = len(edge)
    report["edge_ops"] = dict(sorted(Counter(graph.node[i].op_type for i in edge).items()))
    report["tensorrt_nodes"] = len(parent)
    report["islands"] = len({root(i) for i, n in enumerate(graph.node) if i in parent and n.op_type != "Constant"})
    lo, hi = opset_range
    report["opset_in_range"] = report["opset"] is not None and lo <= report["opset"] <= hi
    return report


def main():
    support, opset_range = read_support(sys.argv[1])
    json.dump({path: check(path, support, opset_range) for path in sys.argv[2:]}, sys.stdout, indent=1)


main()
