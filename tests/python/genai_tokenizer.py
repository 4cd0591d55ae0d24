"""Stock onnxruntime-genai's tokenizer on a genai folder, independent of our Rust code.

Usage: genai_tokenizer.py MODEL_DIR INPUT.json
INPUT.json: {"texts": [...], "chats": [{"messages": [...], "tools": ...}]}. Prints
{"ids": Tokenizer.encode of each text, "prompts": Tokenizer.apply_chat_template of each chat
(tools as JSON, generation prompt added)}.
"""
import json
import sys

import onnxruntime_genai as og


def main(model_dir, input_path):
    request = json.load(open(input_path, encoding="utf-8"))
    tokenizer = og.Tokenizer(og.Model(model_dir))
    ids = [[int(t) for t in tokenizer.encode(text)] for text in request["texts"]]
    prompts = [
        tokenizer.apply_chat_template(
            json.dumps(chat["messages"]), tools=json.dumps(chat["tools"]), add_generation_prompt=True
        )
        for chat in request["chats"]
    ]
    print(json.dumps({"ids": ids, "prompts": prompts}, ensure_ascii=False))


if __name__ == "__main__":
    main(*sys.argv[1:])
