//! The onnxruntime-genai flavour of an export: the `genai_config.json`, `tokenizer.json`
//! and `tokenizer_config.json` beside `model.onnx` (and its own `model.tokenizer.json`)
//! that make a folder stock onnxruntime-genai runs. The graph is the same one plain
//! onnxruntime callers get: genai carries the KV cache, and with it the token history
//! (one more cache pair, so genai's `rewind_to` rewinds it too). Genai's tokenizer encodes like
//! sentencepiece from its own `tokenizer.json` ([`tokenizer`]) and renders the tool prompt,
//! after the BOS, from the chat template.

pub mod tokenizer;

use graphs::contract::names::{self, layer_cache_template};
use graphs::description::ExportDescription;
use graphs::needle2::Config;
use serde_json::{json, Value};

/// The graph's file name inside a genai folder.
pub const MODEL_FILE: &str = "model.onnx";
/// Genai's tokenizer file inside a genai folder (genai looks for it there); the graph's
/// metadata names the plain one beside `model.onnx`.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const CONFIG_FILE: &str = "genai_config.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// `genai_config.json` for the graph `desc` describes. Generation stops at any of
/// `stop_ids` (EOS, and the end of an assistant turn); greedy search by default.
pub fn config(desc: &ExportDescription, c: &Config, stop_ids: &[u32]) -> String {
    let cache = layer_cache_template();
    let config = json!({
        "model": {
            "bos_token_id": desc.tokenizer.bos_id,
            "eos_token_id": stop_ids,
            "pad_token_id": desc.tokenizer.pad_id,
            "context_length": c.common.max_seq_len,
            "vocab_size": c.common.vocab,
            "type": "decoder",
            "decoder": {
                "filename": MODEL_FILE,
                "head_size": c.head_dim,
                "hidden_size": c.common.d_model,
                "num_attention_heads": c.common.num_heads,
                "num_key_value_heads": c.common.num_kv_heads,
                // The attention layers' cache pairs and the token history's.
                "num_hidden_layers": desc.token_history_layer + 1,
                "session_options": {"log_id": "needle", "provider_options": []},
                "inputs": {
                    "input_ids": names::INPUT_IDS,
                    "attention_mask": names::ATTENTION_MASK,
                    "position_ids": names::POSITION_IDS,
                    "past_key_names": cache.past_key,
                    "past_value_names": cache.past_value,
                },
                "outputs": {
                    "logits": names::LOGITS,
                    "present_key_names": cache.present_key,
                    "present_value_names": cache.present_value,
                },
            },
        },
        "search": {
            "do_sample": false,
            "early_stopping": true,
            "max_length": c.common.max_seq_len,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": desc.past_present_share_buffer,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    });
    pretty(&config)
}

/// `tokenizer_config.json`: the special pieces and the chat template. The template writes
/// the BOS piece first, which genai's `encode` turns into the BOS id (it is the genai
/// tokenizer's one added token), so `encode(apply_chat_template(…))` is the model's input
/// as `needle-run` builds it. `add_bos_token` stays false: genai's `encode` ignores it
/// (it passes `add_special_tokens=false`), and a Hugging Face tokenizer that honours it would
/// add a second BOS.
pub fn tokenizer_config(desc: &ExportDescription, special: &SpecialPieces) -> String {
    pretty(&json!({
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": false,
        "add_eos_token": false,
        "bos_token": special.bos,
        "eos_token": special.eos,
        "unk_token": special.unk,
        "pad_token": special.pad,
        "model_max_length": desc.config.max_seq_len(),
        "clean_up_tokenization_spaces": false,
        "legacy": false,
        "chat_template": chat_template(),
    }))
}

/// The chat template: upstream `render_example`'s prompt from a system and a user
/// message and the tools (`chat_template.jinja`).
fn chat_template() -> String {
    include_str!("genai/chat_template.jinja").replace("PYTHON_WHITESPACE", &python_whitespace())
}

/// The characters Python's `str.strip()` removes, as a Jinja list of one-character strings.
/// minja knows only the `\n`, `\r`, `\t` escapes, so the others are written as they are.
fn python_whitespace() -> String {
    let spaces = ('\0'..=char::MAX)
        .filter(|&c| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
        .map(|c| match c {
            '\n' => "'\\n'".to_string(),
            '\r' => "'\\r'".to_string(),
            '\t' => "'\\t'".to_string(),
            c => format!("'{c}'"),
        });
    format!("[{}]", spaces.collect::<Vec<_>>().join(", "))
}

/// The spellings of the special pieces.
pub struct SpecialPieces {
    pub bos: String,
    pub eos: String,
    pub unk: String,
    pub pad: String,
}

fn pretty(v: &Value) -> String {
    let mut text = serde_json::to_string_pretty(v).expect("JSON values serialize");
    text.push('\n');
    text
}
