"""A kernel's error through the Needle kernel library, in stock Python onnxruntime.

Usage: kernel_library_error.py CQ_MATMUL.onnx KERNEL_LIBRARY

The graph is one `needle.CqMatMul` of a 4 x 16 matrix (2-bit codes, one group of 16)
taking `x` [tokens, any]. Runs it once with `x` [1, 16] (the kernel works) and once with
`x` [1, 8] (the kernel refuses the shape) and prints one JSON line: the first run's output
shape and the second run's onnxruntime error, whose type and message Python caught.
"""
import json
import sys

import numpy as np
import onnxruntime as ort


def main(model_path, kernel_library):
    options = ort.SessionOptions()
    options.register_custom_ops_library(kernel_library)
    sess = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    feeds = {
        "codes": np.zeros((4, 4), np.uint8),
        "norms": np.ones((4, 1), np.float16),
        "codebook": np.arange(4, dtype=np.float32),
    }
    good = sess.run(None, {**feeds, "x": np.ones((1, 16), np.float32)})[0]
    try:
        sess.run(None, {**feeds, "x": np.ones((1, 8), np.float32)})
        error = None
    except Exception as e:  # onnxruntime raises its own exception types
        error = {"type": type(e).__name__, "message": str(e)}
    print(json.dumps({"output_shape": list(good.shape), "error": error}))


if __name__ == "__main__":
    main(*sys.argv[1:])
