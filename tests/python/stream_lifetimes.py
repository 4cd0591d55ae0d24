"""How long onnxruntime keeps each layer's residual stream alive in a stock graph.

Usage: stream_lifetimes.py GRAPH.onnx TOKENS

Runs GRAPH once on the CPU EP (one row of TOKENS tokens, empty cache, every output
fetched) with onnxruntime's profiler on, and reads the order it ran the nodes in and each
node's output bytes from the profile, the consumers from the graph it optimised. A tensor
of at least one stream's bytes (`tokens · mhc_lanes · d_model` float32) still read after
the layer that follows its own has begun is "long-lived": what each layer's stream was
when onnxruntime's default order took every lane mean for the heads after the last layer.

Prints one JSON object: `{"nodes": n, "layers": L, "layers_seen": layers whose nodes
ran, "stream_bytes": b, "long_lived": [[tensor, bytes, first, last], ...]}`.
"""
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort


def layer_of(node_name):
    """The layer a node belongs to (`/model/layers.{i}/...`; the embedding's: -1), or
    None for the nodes after the layers and those the builder scopes nowhere."""
    if "/embed_tokens/" in node_name:
        return -1
    marker = "/layers."
    if marker not in node_name:
        return None
    return int(node_name.split(marker, 1)[1].split("/", 1)[0])


def feeds_for(session, tokens):
    feeds = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = (np.arange(tokens, dtype=np.int64) % 200 + 3)[None]
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, tokens), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(tokens, dtype=np.int64)[None]
        else:
            # An empty cache: batch 1, no past positions (a state's fixed dims kept).
            shape = [1] + [d if isinstance(d, int) else 0 for d in i.shape[1:]]
            dtype = np.float32 if i.type == "tensor(float)" else np.int64
            feeds[i.name] = np.zeros(shape, dtype)
    return feeds


def main(path, tokens):
    tokens = int(tokens)
    work = tempfile.mkdtemp(prefix="needle-lifetimes-")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(work, "profile")
    options.optimized_model_filepath = os.path.join(work, "optimized.onnx")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    lanes, d = int(meta["needle.mhc_lanes"]), int(meta["needle.d_model"])
    layers = int(meta["needle.num_layers"])
    session.run(None, feeds_for(session, tokens))
    events = json.load(open(session.end_profiling()))
    order, out_bytes = [], {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][:-len("_kernel_time")]
            order.append(name)
            out_bytes[name] = int(e["args"].get("output_size", 0))
    position = {name: i for i, name in enumerate(order)}
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    produced, last_use = {}, {}
    for node in graph.node:
        if node.name not in position:
            continue
        outputs = [o for o in node.output if o]
        for o in outputs:
            produced[o] = (position[node.name], out_bytes[node.name] // max(1, len(outputs)))
    for node in graph.node:
        for t in node.input:
            if t in produced and node.name in position:
                last_use[t] = max(last_use.get(t, 0), position[node.name])
    graph_outputs = {o.name for o in graph.output}
    stream_bytes = tokens * lanes * d * 4
    # Where each layer's nodes begin in the run (the builder scopes them `layers.{i}/`).
    starts = {}
    for i, name in enumerate(order):
        layer = layer_of(name)
        if layer is not None:
            starts.setdefault(layer, i)
    producer = {o: n.name for n in graph.node for o in n.output if o}
    long_lived = []
    for t, (first, size) in produced.items():
        if size < stream_bytes or t in graph_outputs:
            continue
        layer = layer_of(producer[t])
        if layer is None:
            continue
        # Read by the layer after its own at the latest (the embedding's: by layer 0).
        bound = starts.get(layer + 2, len(order))
        last = last_use.get(t, first)
        if last >= bound:
            long_lived.append([t, size, first, last])
    print(json.dumps({"nodes": len(order), "layers": layers,
                      "layers_seen": len([k for k in starts if k >= 0]),
                      "stream_bytes": stream_bytes, "long_lived": long_lived}))


if __name__ == "__main__":
    main(*sys.argv[1:])
