"""onnxruntime's mobile usability checker on one graph, as numbers instead of log lines.

Usage: mobile_partitions.py MODEL.onnx

Runs exactly what `python -m onnxruntime.tools.check_onnx_model_mobile_usability` runs
(its BASIC-level optimization, ONNX shape inference, then its partitioning estimate per
execution provider with fixed input sizes required) and prints one JSON object: per EP
(`NNAPI`, `CoreML NeuralNetwork`, `CoreML MLProgram`) the nodes, the supported nodes, the
partitions, the largest partition's size, the unsupported op types, the nodes left out for
a dynamic shape, and the checker's verdict (`YES`, `MAYBE`, `NO`).
"""
import json
import pathlib
import sys
import tempfile

from onnxruntime.tools.mobile_helpers import usability_checker as checker
from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

EPS = {
    "NNAPI": checker.check_nnapi_partitions,
    "CoreML NeuralNetwork": lambda model, fixed: checker.check_coreml_partitions(
        model, fixed, "coreml_supported_neuralnetwork_ops.md"),
    "CoreML MLProgram": lambda model, fixed: checker.check_coreml_partitions(
        model, fixed, "coreml_supported_mlprogram_ops.md"),
}


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
        return report


if __name__ == "__main__":
    print(json.dumps(partitions(pathlib.Path(sys.argv[1]).resolve())))
