//! The tokenizer as a `tokenizer.json` document, the file format of HF `tokenizers`
//! (read by its Python package, transformers.js and onnxruntime-extensions), written key
//! for key as `tokenizers` 0.22 serializes such a tokenizer; and that document read back.

use super::normalizer::{Normalizer, SPACE};
use anyhow::{anyhow, bail, Result};
use serde_json::{json, Map, Value};

/// What `tokenizer.json` holds beyond the normalizer and decoder, which follow from the
/// settings a graph records and the markers.
pub(super) struct Document {
    /// Piece texts by id.
    pub pieces: Vec<String>,
    /// BPE merges in rank order.
    pub merges: Vec<(String, String)>,
    /// The chat markers' ids (HF's added tokens).
    pub markers: Vec<u32>,
    pub unk: u32,
    pub byte_fallback: bool,
}

impl Document {
    pub(super) fn write(&self, normalizer: &Normalizer, add_dummy_prefix: bool) -> String {
        let added: Vec<Value> = self
            .markers
            .iter()
            .map(|&id| {
                json!({
                    "id": id,
                    "content": self.pieces[id as usize],
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": true,
                    "special": false,
                })
            })
            .collect();
        let vocab: Map<String, Value> = self
            .pieces
            .iter()
            .enumerate()
            .map(|(id, text)| (text.clone(), json!(id)))
            .collect();
        let merges: Vec<Value> = self.merges.iter().map(|(l, r)| json!([l, r])).collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer.to_json(),
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": decoder(add_dummy_prefix),
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": self.pieces[self.unk as usize],
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": self.byte_fallback,
                "ignore_merges": false,
                "vocab": vocab,
                "merges": merges,
            },
        })
        .to_string()
    }

    /// Reads what a document holds beyond its normalizer and decoder.
    pub(super) fn read(json: &Value) -> Result<Self> {
        let model = &json["model"];
        if model["type"] != "BPE" {
            bail!("tokenizer.json: model.type is not \"BPE\"");
        }
        let pieces = vocab_by_id(&model["vocab"])?;
        let merges = model["merges"]
            .as_array()
            .ok_or_else(|| anyhow!("tokenizer.json: model.merges is not a list"))?
            .iter()
            .map(merge_pair)
            .collect::<Result<Vec<_>>>()?;
        let id_of = |text: &str, what: &str| -> Result<u32> {
            pieces
                .iter()
                .position(|p| p == text)
                .map(|id| id as u32)
                .ok_or_else(|| anyhow!("tokenizer.json: {what} {text:?} is not in model.vocab"))
        };
        let unk_text = model["unk_token"]
            .as_str()
            .ok_or_else(|| anyhow!("tokenizer.json: model.unk_token is not a string"))?;
        let unk = id_of(unk_text, "model.unk_token")?;
        let byte_fallback = model["byte_fallback"]
            .as_bool()
            .ok_or_else(|| anyhow!("tokenizer.json: model.byte_fallback is not true or false"))?;
        let markers = json["added_tokens"]
            .as_array()
            .ok_or_else(|| anyhow!("tokenizer.json: added_tokens is not a list"))?
            .iter()
            .map(|token| {
                let content = token["content"].as_str().unwrap_or_default();
                let id = id_of(content, "added token")?;
                if token["id"] != json!(id) {
                    bail!("tokenizer.json: added token {content:?} has an id other than its model.vocab id {id}");
                }
                Ok(id)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Document {
            pieces,
            merges,
            markers,
            unk,
            byte_fallback,
        })
    }
}

/// The decoder HF uses for SentencePiece BPE models, for users of the serialized
/// `tokenizer.json`; [`super::NeedleTokenizer::decode`] ports sentencepiece's own rules.
fn decoder(add_dummy_prefix: bool) -> Value {
    let mut steps = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE.to_string()}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_dummy_prefix {
        steps.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({"type": "Sequence", "decoders": steps})
}

/// `model.vocab` (text → id) as texts by id; the ids must be 0..n, each once.
fn vocab_by_id(vocab: &Value) -> Result<Vec<String>> {
    let vocab = vocab
        .as_object()
        .ok_or_else(|| anyhow!("tokenizer.json: model.vocab is not an object"))?;
    let mut pieces = vec![None; vocab.len()];
    for (text, id) in vocab {
        let slot = id
            .as_u64()
            .and_then(|id| pieces.get_mut(id as usize))
            .ok_or_else(|| {
                anyhow!(
                    "tokenizer.json: model.vocab id {id} of {text:?} is not below its size {}",
                    vocab.len()
                )
            })?;
        if slot.replace(text.clone()).is_some() {
            bail!("tokenizer.json: model.vocab gives id {id} twice");
        }
    }
    Ok(pieces
        .into_iter()
        .map(|p| p.expect("n distinct ids below n fill every slot"))
        .collect())
}

/// A merge as `["left", "right"]` (what `tokenizers` writes) or `"left right"`.
fn merge_pair(merge: &Value) -> Result<(String, String)> {
    let pair = match merge {
        Value::Array(parts) => match &parts[..] {
            [Value::String(l), Value::String(r)] => Some((l.clone(), r.clone())),
            _ => None,
        },
        Value::String(text) => text
            .split_once(' ')
            .map(|(l, r)| (l.to_string(), r.to_string())),
        _ => None,
    };
    pair.ok_or_else(|| {
        anyhow!("tokenizer.json: model.merges has an entry that is not a pair: {merge}")
    })
}
