"""Tool calls through stock onnxruntime-genai alone, independent of our Rust code.

Usage: genai_generate.py MODEL_DIR CHATS.json MAX_NEW_TOKENS BATCH
CHATS.json: a list of {"messages": [...], "tools": [...]}. Each chat's prompt comes from the
folder's chat template (Tokenizer.apply_chat_template) and its ids from genai's ordinary
Tokenizer.encode of it, nothing prepended. Runs the prompts greedily in groups of
BATCH (genai right-pads a group with pad_token_id) and prints one JSON list: per chat, its
prompt, prompt_ids, the generated_ids up to, not including, the first stop token of
genai_config.json, and their text as genai's tokenizer decodes them.
"""
import json
import sys

import numpy as np
import onnxruntime_genai as og

from genai_folder import GenaiFolder


def main(model_dir, chats_path, max_new, batch):
    max_new, batch = int(max_new), int(batch)
    chats = json.load(open(chats_path, encoding="utf-8"))
    folder = GenaiFolder(model_dir)
    model, tokenizer, stops = folder.model, folder.tokenizer, folder.stops
    out = []
    for chat in chats:
        prompt, ids = folder.prompt(chat["messages"], chat["tools"])
        out.append({"prompt": prompt, "prompt_ids": ids})
    for start in range(0, len(out), batch):
        group = out[start:start + batch]
        longest = max(len(o["prompt_ids"]) for o in group)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=longest + max_new, batch_size=len(group))
        generator = og.Generator(model, params)
        pad = folder.config["pad_token_id"]
        rows = [o["prompt_ids"] + [pad] * (longest - len(o["prompt_ids"])) for o in group]
        generator.append_tokens(np.array(rows, np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        for i, o in enumerate(group):
            generated = []
            for t in generator.get_sequence(i)[longest:]:
                if int(t) in stops:
                    break
                generated.append(int(t))
            o["generated_ids"] = generated
            o["text"] = tokenizer.decode(np.array(generated, np.int32))
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main(*sys.argv[1:])
