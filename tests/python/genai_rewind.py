"""Partial rewinds through stock onnxruntime-genai alone, independent of our Rust code.

Usage: genai_rewind.py MODEL_DIR CHATS.json MAX_NEW_TOKENS
CHATS.json: a list of {"messages": [...], "tools": [...]}. For each chat's prompt (chat
template, genai's ordinary encode) it generates greedily, keeping
the logits of every step, then on the same generator:
- answer: rewind_to halfway through the answer and generate again;
- prompt: rewind_to 5 tokens before the prompt's end, append those 5 again, generate;
- edit: the same chat with " Thanks!" after the user's message: rewind_to where the two
  prompts' ids part, append the rest of the edited one, generate, and compare with a fresh
  generator given the edited prompt whole.
Prints one JSON list, per chat: for each check whether the tokens equal the reference
run's and the largest |logit difference| over the steps both made.
"""
import json
import sys

import numpy as np
import onnxruntime_genai as og

from genai_folder import GenaiFolder


def run(generator, stops):
    """Generates to the end of the answer; the logits each token was chosen from (genai
    computes them on get_logits, or else in generate_next_token)."""
    logits = []
    while not generator.is_done():
        logits.append(np.array(generator.get_logits(), np.float32).reshape(-1))
        generator.generate_next_token()
        if int(generator.get_next_tokens()[0]) in stops:
            break
    return logits


def compare(tokens, logits, ref_tokens, ref_logits):
    steps = min(len(logits), len(ref_logits))
    error = max((float(np.abs(a - b).max()) for a, b in zip(logits[-steps:], ref_logits[-steps:])),
                default=0.0)
    return {"equal": tokens == ref_tokens, "steps": steps, "max_logit_error": error}


def main(model_dir, chats_path, max_new):
    max_new = int(max_new)
    chats = json.load(open(chats_path, encoding="utf-8"))
    folder = GenaiFolder(model_dir)
    model, stops = folder.model, folder.stops

    def generator_for(ids):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + max_new)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([ids], np.int32))
        return generator

    out = []
    for chat in chats:
        _, ids = folder.prompt(chat["messages"], chat["tools"])
        generator = generator_for(ids)
        ref_logits = run(generator, stops)
        ref = [int(t) for t in generator.get_sequence(0)]
        result = {"prompt_tokens": len(ids), "answer_tokens": len(ref) - len(ids)}

        half = len(ids) + (len(ref) - len(ids)) // 2
        generator.rewind_to(half)
        logits = run(generator, stops)
        result["answer"] = compare([int(t) for t in generator.get_sequence(0)], logits, ref,
                                   ref_logits)

        cut = len(ids) - 5
        generator.rewind_to(cut)
        generator.append_tokens(np.array([ids[cut:]], np.int32))
        logits = run(generator, stops)
        result["prompt"] = compare([int(t) for t in generator.get_sequence(0)], logits, ref,
                                   ref_logits)

        messages = [dict(m) for m in chat["messages"]]
        messages[-1]["content"] += " Thanks!"
        _, edited = folder.prompt(messages, chat["tools"])
        common = next(i for i, (a, b) in enumerate(zip(ids, edited)) if a != b)
        generator.rewind_to(common)
        generator.append_tokens(np.array([edited[common:]], np.int32))
        logits = run(generator, stops)
        tokens = [int(t) for t in generator.get_sequence(0)]
        fresh = generator_for(edited)
        fresh_logits = run(fresh, stops)
        result["edit"] = compare(tokens, logits, [int(t) for t in fresh.get_sequence(0)],
                                 fresh_logits)
        out.append(result)
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
