"""Greedy generation through stock onnxruntime-genai from token ids, independent of our Rust code.

Usage: genai_generate.py MODEL_DIR PROMPTS.json MAX_NEW_TOKENS BATCH
PROMPTS.json: a list of prompt id lists (BOS included). Runs them in groups of BATCH
(genai right-pads a group with pad_token_id) and prints one JSON list: per prompt, the
generated ids up to, not including, the first stop token of genai_config.json.
"""
import json
import sys

import numpy as np
import onnxruntime_genai as og


def main(model_dir, prompts_path, max_new, batch):
    max_new, batch = int(max_new), int(batch)
    prompts = json.load(open(prompts_path))
    config = json.load(open(f"{model_dir}/genai_config.json"))["model"]
    stops = config["eos_token_id"]
    stops = set(stops if isinstance(stops, list) else [stops])
    pad = config["pad_token_id"]
    model = og.Model(model_dir)
    out = []
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        longest = max(len(p) for p in group)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=longest + max_new, batch_size=len(group))
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([p + [pad] * (longest - len(p)) for p in group], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        for i in range(len(group)):
            generated = []
            for t in list(generator.get_sequence(i))[longest:]:
                if int(t) in stops:
                    break
                generated.append(int(t))
            out.append(generated)
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
