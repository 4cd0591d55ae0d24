//! The `tokenizer.json` of a genai folder: the model's BPE vocabulary and merges, written
//! so that onnxruntime-extensions (genai's tokenizer) encodes like sentencepiece.
//!
//! Extensions reads a `tokenizer.json` its own way (`operators/tokenizer/bpe_kernels.cc`,
//! `bpe_tokenizer_model.hpp`, `bpe_utils.hpp`):
//! - it ignores the normalizer; a `Replace ▁→" "` decoder selects its SentencePiece path
//!   (`SpmTokenize`) and a `Strip " "` decoder makes it prepend `▁`, both as in the plain
//!   `tokenizer.json`;
//! - it prepends that `▁` to every stretch between added tokens, where sentencepiece puts
//!   one at the start of the text. So the chat markers are plain vocabulary pieces, not
//!   added tokens, and the pre-tokenizer keeps each marker a pre-token of its own, which is
//!   then found whole in the vocabulary. The one added token is the BOS piece (`<s>`),
//!   which the chat template writes first: genai's `encode` passes
//!   `add_special_tokens=false`, so `add_bos_token` would add nothing, and extensions takes
//!   the BOS id only from an added token. The prompt after it is then one stretch, which
//!   gets sentencepiece's `▁`, so `encode(template)` is `[BOS] + encode(prompt)`. A literal
//!   `<s>` in a message becomes the BOS id too, as in Hugging Face tokenizers (sentencepiece
//!   spells it out);
//! - a top-level `Split` with a `Regex` is run with C++ `std::regex` (ECMAScript, over the
//!   UTF-8 bytes): the next match is searched for and what lies before it is dropped;
//! - each pre-token is looked up whole in the vocabulary, else byte-fallback BPE-merged.
//!
//! The regex cuts the text where sentencepiece's BPE cannot merge across: before a space
//! (no piece has `▁` after its start) and around markers. With `remove_extra_whitespaces`
//! it drops the spaces sentencepiece drops between words: a word takes one space in front,
//! and one behind when only spaces lie between it and a marker; the other spaces are
//! searched past. Extensions' own quirks stay: a text that starts with a space takes
//! another path that keeps every space, trailing spaces each give a `▁`, and with spaces
//! between two markers none is kept.

use crate::cact::tokenizer_blob::{PieceKind, TokenizerSpec};
use crate::tokenizer::{regex_escape, NeedleTokenizer};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A word is at most this many groups of [`GROUP_BYTES`]: `std::regex` recurses once or
/// more per matched byte (a 30 kB word overflows an 8 MB stack; a 1024-byte one takes about
/// 350 kB in genai 0.18) and compiles a bounded repeat into that many copies (at most
/// 100 000 states), so the bound is nested. Longer space-free runs are cut into such
/// words, where BPE may then differ from sentencepiece.
const WORD_GROUPS: usize = 16;
/// Bytes in one group of a word: a first character, then up to `GROUP_BYTES - 1` bytes.
const GROUP_BYTES: usize = 64;

/// `tokenizer.json` for onnxruntime-extensions, from `tokenizer` (built from `spec`).
pub fn tokenizer_json(tokenizer: &NeedleTokenizer, spec: &TokenizerSpec) -> Result<String> {
    if !spec.byte_fallback {
        bail!("genai's tokenizer needs a tokenizer with byte-fallback pieces");
    }
    let texts = |kinds: &[PieceKind]| -> Vec<&str> {
        let pieces = spec.pieces.iter().filter(|p| kinds.contains(&p.kind));
        pieces.map(|p| p.text.as_str()).collect()
    };
    let markers = texts(&[PieceKind::UserDefined]);
    let names = texts(&[PieceKind::Control, PieceKind::Unknown, PieceKind::Byte]);
    let regex = pre_tokenizer_regex(&markers, &names, tokenizer.remove_extra_whitespaces())?;
    let mut json: Value =
        serde_json::from_str(&tokenizer.to_json()).expect("a serialized tokenizer is JSON");
    json["added_tokens"] = json!([bos_added_token(spec)?]);
    json["normalizer"] = Value::Null;
    json["pre_tokenizer"] = json!({
        "type": "Split",
        "pattern": {"Regex": regex},
        "behavior": "Isolated",
        "invert": false,
    });
    Ok(json.to_string())
}

/// The BOS piece as a special added token (what extensions takes the BOS id from).
fn bos_added_token(spec: &TokenizerSpec) -> Result<Value> {
    let Some(bos) = spec.pieces.get(spec.bos_id as usize) else {
        bail!(
            "the tokenizer's BOS id {} is not one of its pieces",
            spec.bos_id
        );
    };
    Ok(json!({
        "id": spec.bos_id,
        "content": bos.text,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": true,
    }))
}

/// The pre-tokenizer's alternatives, first match wins: a marker; the first character of a
/// control or byte piece's name (`<s>`, `<0x41>`) that would otherwise be a whole
/// pre-token, which extensions would turn into that piece where sentencepiece spells it
/// out; a word; without `remove_extra_whitespaces`, a lone space. With it, a space before a
/// marker rides on the word before it: extensions places a match by searching for its
/// text, so a lone-space match would be taken for the first space of a run.
fn pre_tokenizer_regex(
    markers: &[&str],
    names: &[&str],
    remove_extra_whitespaces: bool,
) -> Result<String> {
    let mut heads: BTreeMap<u8, Vec<&str>> = BTreeMap::new();
    for marker in markers {
        match marker.as_bytes().first() {
            Some(&head) if head.is_ascii() && head != b' ' => {
                heads.entry(head).or_default().push(&marker[1..]);
            }
            _ => bail!(
                "genai's tokenizer cannot keep the user-defined piece {marker:?} whole: \
                 it must start with an ASCII character other than a space"
            ),
        }
    }
    let marker = alternation(markers);
    let heads_hex: String = heads.keys().map(|head| format!("\\x{head:02X}")).collect();
    // Inside a word: any byte but a space and the characters markers start with, which
    // may only begin a group of the word, and only when no marker starts there.
    let inner = format!("[^ {heads_hex}]");
    let group_start: Vec<String> = [inner.clone()]
        .into_iter()
        .chain(
            heads
                .iter()
                .map(|(head, tails)| format!("\\x{head:02X}(?!{})", alternation(tails))),
        )
        .collect();
    let mut word = format!(
        " ?(?:(?:{}){inner}{{0,{}}}){{1,{WORD_GROUPS}}}(?![\\x80-\\xBF])",
        group_start.join("|"),
        GROUP_BYTES - 1,
    );
    if remove_extra_whitespaces {
        word += &format!("(?: (?= *{marker}))?");
    }

    let pre_token_end = format!("(?: |{marker}|$)");
    let mut by_first: BTreeMap<char, Vec<&str>> = BTreeMap::new();
    for name in names {
        let mut chars = name.chars();
        if let (Some(c), rest) = (chars.next(), chars.as_str()) {
            if !rest.is_empty() {
                by_first.entry(c).or_default().push(rest);
            }
        }
    }
    let name_guards = by_first.iter().map(|(c, rests)| {
        format!(
            "{}(?={}{pre_token_end})",
            regex_escape(&c.to_string()),
            alternation(rests)
        )
    });

    let mut alternatives: Vec<String> = [marker].into_iter().chain(name_guards).collect();
    alternatives.push(word);
    if !remove_extra_whitespaces {
        alternatives.push(" ".into());
    }
    Ok(alternatives.join("|"))
}

/// `(?:w1|w2|…)`, longest first so that a marker wins over one it begins with.
fn alternation(words: &[&str]) -> String {
    let mut words = words.to_vec();
    words.sort_by_key(|w| std::cmp::Reverse(w.len()));
    let escaped: Vec<String> = words.iter().map(|w| regex_escape(w)).collect();
    format!("(?:{})", escaped.join("|"))
}

#[cfg(test)]
mod tests {
    use super::pre_tokenizer_regex;

    #[test]
    fn a_marker_the_regex_cannot_exclude_from_words_is_an_error() {
        for marker in ["\u{2581}x", " x", "\u{e9}x"] {
            let error = pre_tokenizer_regex(&[marker], &[], true).unwrap_err();
            assert!(error.to_string().contains("ASCII"), "{marker:?}: {error}");
        }
    }
}
