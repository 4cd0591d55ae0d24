"""What the genai test scripts share: a `needle-export --genai` folder opened with stock
onnxruntime-genai, and a chat's prompt as the folder renders and encodes it."""
import json

import onnxruntime_genai as og


class GenaiFolder:
    def __init__(self, model_dir):
        self.config = json.load(open(f"{model_dir}/genai_config.json"))["model"]
        stops = self.config["eos_token_id"]
        self.stops = set(stops if isinstance(stops, list) else [stops])
        self.model = og.Model(model_dir)
        self.tokenizer = og.Tokenizer(self.model)

    def prompt(self, messages, tools):
        """The chat template's prompt and its ids from genai's ordinary encode, as genai's
        example programs make them (the template writes the BOS)."""
        text = self.tokenizer.apply_chat_template(
            json.dumps(messages), tools=json.dumps(tools), add_generation_prompt=True
        )
        return text, [int(t) for t in self.tokenizer.encode(text)]
