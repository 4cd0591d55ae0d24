"""onnxruntime's mobile usability checker on one graph, as numbers instead of log lines.

Usage: mobile_partitions.py MODEL.onnx

Runs exactly what `python -m onnxruntime.tools.check_onnx_model_mobile_usability` runs
(its BASIC-level optimization, ONNX shape inference, then its partitioning estimate per
execution provider with fixed input sizes required) and prints one JSON object: per EP
(`NNAPI`, `CoreML NeuralNetwork`, `CoreML MLProgram`) the nodes, the supported nodes, the
partitions, the largest partition's size, the unsupported op types, the nodes left out for
a dynamic shape, and the checker's verdict (`YES`, `MAYBE`, `NO`); and under `notes` the
nodes that break a per-op note the checker prints but does not check (its caveats: constant
`Slice`/`Split`/`Squeeze`/`Unsqueeze` inputs, int32 or constant `Gather` indices for NNAPI,
a constant `Gemm` B, float32 `Pow` for CoreML), and the nodes the checker cannot see into
(`If`/`Loop`/`Scan`, local functions, other domains), each a list of node names.
"""
import json
import pathlib
import sys
import tempfile

from onnxruntime.tools.mobile_helpers import usability_checker as checker
from onnx import TensorProto
from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

EPS = {
    "NNAPI": checker.check_nnapi_partitions,
    "CoreML NeuralNetwork": lambda model, fixed: checker.check_coreml_partitions(
        model, fixed, "coreml_supported_neuralnetwork_ops.md"),
    "CoreML MLProgram": lambda model, fixed: checker.check_coreml_partitions(
        model, fixed, "coreml_supported_mlprogram_ops.md"),
}


# Op type → the inputs (by position, `None`: all but the first) the notes want constant.
CONSTANT_INPUTS = {"Slice": None, "Split": [1], "Squeeze": [1], "Unsqueeze": [1], "Gemm": [1]}


def notes(model):
    """The nodes that break a per-op note, by note."""
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    # A Cast of an initializer is constant too: the CPU EP the checker optimises with casts
    # the float16 weights of the ops it runs in float32; an EP taking them reads them as is.
    constants |= {n.output[0] for n in graph.node
                  if n.op_type == "Cast" and n.input[0] in constants}
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    found = {"constant inputs": [], "gather indices": [], "pow float32": [], "hidden": []}
    for node in graph.node:
        wanted = CONSTANT_INPUTS.get(node.op_type)
        if wanted is not None or node.op_type == "Slice":
            names = node.input[1:] if wanted is None else [node.input[i] for i in wanted
                                                            if i < len(node.input)]
            if any(n and n not in constants for n in names):
                found["constant inputs"].append(node.name)
        if node.op_type == "Gather":
            index = node.input[1]
            if index not in constants and types.get(index) != TensorProto.INT32:
                found["gather indices"].append(node.name)
        if node.op_type == "Pow" and types.get(node.input[0]) != TensorProto.FLOAT:
            found["pow float32"].append(node.name)
        if node.op_type in ("If", "Loop", "Scan") or node.domain not in ("", "ai.onnx"):
            found["hidden"].append(node.name)
    if model.functions:
        found["hidden"].extend(f.name for f in model.functions)
    return found


def partitions(path):
    with tempfile.TemporaryDirectory() as tmp:
        optimized = pathlib.Path(tmp) / path.name
        optimize_model(path, optimized, use_external_initializers=True)
        model = ModelProtoWithShapeInfo(optimized.resolve(strict=True)).model_with_shape_info
        report = {}
        for ep, check in EPS.items():
            info = check(model, True)
            report[ep] = {
                "nodes": info.num_nodes,
                "supported": info.num_supported_nodes,
                "partitions": info.num_partitions,
                "largest_partition": max((len(g) for g in info.supported_groups), default=0),
                "unsupported_ops": sorted(info.unsupported_ops),
                "dynamic_shape_nodes": info.nodes_unsupported_due_to_dynamic_input,
                "verdict": info.suitability().name,
            }
        report["notes"] = notes(model)
        return report


if __name__ == "__main__":
    print(json.dumps(partitions(pathlib.Path(sys.argv[1]).resolve())))
