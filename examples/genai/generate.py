"""Tool calling with stock onnxruntime-genai from a `needle-export --genai` folder.

Usage: python generate.py DIR TOOLS.json "query" [MAX_NEW_TOKENS]
Renders the tool prompt with the folder's chat template, encodes it with genai's tokenizer
(the template writes the BOS, so nothing is prepended: prepending bos_token_id would give
two), generates greedily, prints the generated ids and text.
"""
import json
import sys

import numpy as np
import onnxruntime_genai as og


def main(folder, tools_path, query, max_new_tokens=128):
    model = og.Model(folder)
    tokenizer = og.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": query}])
    tools = open(tools_path, encoding="utf-8").read()
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    ids = list(tokenizer.encode(prompt))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + int(max_new_tokens))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    generated = generator.get_sequence(0)[len(ids):]
    print(json.dumps([int(t) for t in generated]))
    print(tokenizer.decode(generated))


if __name__ == "__main__":
    main(*sys.argv[1:])
