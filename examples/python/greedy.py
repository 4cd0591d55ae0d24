"""Greedy generation with a needle-export graph in plain Python onnxruntime.

Usage: python greedy.py MODEL.onnx "text to continue" [MAX_NEW_TOKENS]
Prints the generated token ids and text ([BOS] + tokenize(text), stops at EOS).
"""
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


def generate(session, prompt_ids, max_new_tokens, eos_id):
    meta = session.get_modelmeta().custom_metadata_map
    feeds = {}
    for i in session.get_inputs():  # empty state: no past tokens
        if i.name.startswith("past_"):
            shape = [1 if d == "batch" else 0 if d == "past_sequence" else d for d in i.shape]
            dtype = np.int64 if i.type == "tensor(int64)" else (
                np.float16 if meta["needle.precision"] == "fp16" else np.float32)
            feeds[i.name] = np.zeros(shape, dtype)
    outputs = [o.name for o in session.get_outputs()]
    ids, past, generated = prompt_ids, 0, []
    while len(generated) < max_new_tokens:
        feeds["input_ids"] = np.array([ids], np.int64)
        feeds["attention_mask"] = np.ones((1, past + len(ids)), np.int64)
        feeds["position_ids"] = np.arange(past, past + len(ids), dtype=np.int64)[None]
        result = dict(zip(outputs, session.run(outputs, feeds)))
        next_id = int(result["logits"][0, -1].argmax())
        if next_id == eos_id:
            break
        generated.append(next_id)
        # present.X -> past_key_values.X (the KV cache, token history included)
        for name, value in result.items():
            if name.startswith("present."):
                feeds["past_key_values." + name[len("present."):]] = value
        past, ids = past + len(ids), [next_id]
    return generated


def main(model_path, text, max_new_tokens=32):
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    tokenizer = Tokenizer.from_file(str(Path(model_path).parent / meta["needle.tokenizer"]))
    prompt = [int(meta["needle.bos_token_id"])] + tokenizer.encode(text, add_special_tokens=False).ids
    generated = generate(session, prompt, int(max_new_tokens), int(meta["needle.eos_token_id"]))
    print(generated)
    print(tokenizer.decode(generated))


if __name__ == "__main__":
    main(*sys.argv[1:])
