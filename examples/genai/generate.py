"""Greedy generation with stock onnxruntime-genai from a `needle-export --genai` folder.

Usage: python generate.py DIR "text to continue" [MAX_NEW_TOKENS]
Tokenizes [BOS] + text with tokenizer.json (HF tokenizers), prints the generated ids and text.
"""
import json
import sys

import numpy as np
import onnxruntime_genai as og
from tokenizers import Tokenizer


def main(folder, text, max_new_tokens=128):
    model = og.Model(folder)
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    bos = json.load(open(f"{folder}/genai_config.json"))["model"]["bos_token_id"]
    ids = [bos] + tokenizer.encode(text, add_special_tokens=False).ids
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + int(max_new_tokens))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    generated = [int(t) for t in generator.get_sequence(0)[len(ids):]]
    print(json.dumps(generated))
    print(tokenizer.decode(generated))


if __name__ == "__main__":
    main(*sys.argv[1:])
