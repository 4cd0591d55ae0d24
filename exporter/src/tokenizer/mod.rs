//! The SentencePiece BPE tokenizer of a `.cact`: it encodes exactly like
//! `sentencepiece`'s `Encode`, and is written out as a `tokenizer.json` that HF
//! `tokenizers` encodes with to the same ids.
//!
//! Encoding, as sentencepiece does it:
//! 1. optional whitespace rule (`remove_extra_whitespaces`): drop leading U+0020,
//!    collapse runs of U+0020, strip trailing U+0020 and `▁`;
//! 2. spaces become `▁`, and a dummy `▁` is prepended (`add_dummy_prefix`);
//! 3. the chat markers (USER_DEFINED pieces) are cut out wherever they occur;
//! 4. every other stretch is BPE-merged by piece score, with byte fallback.
//!
//! Steps 1–2 are normalizers and step 3 uses normalized added tokens in the
//! serialized `tokenizer.json`; encoding here follows HF's reading of that file
//! ([`bpe`], [`normalizer`]), so `needle-run` and its users get the same ids.

mod bpe;
mod json;
mod normalizer;

use crate::cact::tokenizer_blob::{Piece, PieceKind, TokenizerSpec};
use anyhow::{anyhow, bail, Result};
use bpe::Bpe;
use json::Document;
pub(crate) use normalizer::regex_escape;
use normalizer::{Normalizer, Segment, SPACE};
use std::collections::HashMap;

const UNK_SURFACE: &str = " \u{2047} ";

/// The special ids of a tokenizer (the `.cact` blob header).
#[derive(Clone, Copy, Debug)]
pub struct SpecialIds {
    pub pad: u32,
    pub eos: u32,
    pub bos: u32,
    pub unk: u32,
}

/// Opens a chat turn (a user-defined piece of every Needle tokenizer).
pub const IM_START: &str = "<|im_start|>";
/// Closes a chat turn; tool-mode generation stops at it.
pub const IM_END: &str = "<|im_end|>";

/// A SentencePiece BPE tokenizer built from a `.cact` tokenizer blob.
pub struct NeedleTokenizer {
    bpe: Bpe,
    normalizer: Normalizer,
    /// BPE merges in rank order, for `tokenizer.json`.
    merges: Vec<(String, String)>,
    unk_id: u32,
    byte_fallback: bool,
    pieces: Vec<Piece>,
    pad_id: u32,
    eos_id: u32,
    bos_id: u32,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    dummy_prefix_ids: Vec<u32>,
}

impl NeedleTokenizer {
    /// Builds the tokenizer. `remove_extra_whitespaces` is sentencepiece's
    /// normalizer option of that name (true is its default and what the Needle
    /// tokenizers were trained with); the blob does not record it.
    pub fn from_spec(spec: &TokenizerSpec, remove_extra_whitespaces: bool) -> Result<Self> {
        if spec.pieces.get(spec.unk_id as usize).is_none() {
            bail!("tokenizer unk_id {} is not a piece id", spec.unk_id);
        }
        let special = SpecialIds {
            pad: spec.pad_id,
            eos: spec.eos_id,
            bos: spec.bos_id,
            unk: spec.unk_id,
        };
        Self::assemble(
            spec.pieces.clone(),
            merges(&spec.pieces),
            special,
            spec.byte_fallback,
            spec.add_dummy_prefix,
            remove_extra_whitespaces,
        )
    }

    /// Loads a `tokenizer.json` written by [`Self::to_json`]; the settings that the
    /// JSON does not carry come from the graph's metadata. Piece kinds follow
    /// from the ids and the added tokens.
    pub fn from_json(
        json: &str,
        special: SpecialIds,
        add_dummy_prefix: bool,
        remove_extra_whitespaces: bool,
    ) -> Result<Self> {
        let json: serde_json::Value =
            serde_json::from_str(json).map_err(|e| anyhow!("tokenizer.json is not JSON: {e}"))?;
        let document = Document::read(&json)?;
        let pieces = document
            .pieces
            .into_iter()
            .enumerate()
            .map(|(id, text)| {
                let id = id as u32;
                // Markers first: a blob may make a special id a user-defined piece, and
                // `from_spec` then treats it as a marker.
                let kind = if document.markers.contains(&id) {
                    PieceKind::UserDefined
                } else if id == special.unk {
                    PieceKind::Unknown
                } else if [special.pad, special.eos, special.bos].contains(&id) {
                    PieceKind::Control
                } else if Piece::is_byte_text(&text) {
                    PieceKind::Byte
                } else {
                    PieceKind::Normal
                };
                Piece {
                    text,
                    score: 0.0,
                    kind,
                }
            })
            .collect();
        if document.unk != special.unk {
            bail!(
                "tokenizer.json's unk_token is id {}, the graph's metadata says {}",
                document.unk,
                special.unk
            );
        }
        let tokenizer = Self::assemble(
            pieces,
            document.merges,
            special,
            document.byte_fallback,
            add_dummy_prefix,
            remove_extra_whitespaces,
        )?;
        // Encoding follows the normalizer these settings make, so the file must say the same.
        let written: serde_json::Value =
            serde_json::from_str(&tokenizer.to_json()).expect("a written tokenizer.json is JSON");
        if json != written {
            bail!(
                "tokenizer.json is not the one needle-export writes for this vocabulary and the \
                 graph's tokenizer settings (add_dummy_prefix {add_dummy_prefix}, \
                 remove_extra_whitespaces {remove_extra_whitespaces})"
            );
        }
        Ok(tokenizer)
    }

    fn assemble(
        pieces: Vec<Piece>,
        merges: Vec<(String, String)>,
        special: SpecialIds,
        byte_fallback: bool,
        add_dummy_prefix: bool,
        remove_extra_whitespaces: bool,
    ) -> Result<Self> {
        let vocab: HashMap<String, u32> = pieces
            .iter()
            .enumerate()
            .map(|(id, piece)| (piece.text.clone(), id as u32))
            .collect();
        if vocab.len() != pieces.len() {
            bail!("tokenizer blob has duplicate piece texts");
        }
        let bpe = Bpe::new(vocab, &merges, special.unk, byte_fallback)?;
        let markers: Vec<(&str, u32)> = pieces
            .iter()
            .enumerate()
            .filter(|(_, p)| p.kind == PieceKind::UserDefined)
            .map(|(id, p)| (p.text.as_str(), id as u32))
            .collect();
        let normalizer = Normalizer::new(remove_extra_whitespaces, add_dummy_prefix, &markers);
        // HF matches added tokens by their normalized form: one that normalizes
        // to nothing (e.g. `▁` or "") would match the empty string, on which
        // `tokenizers` panics ("AddedVocabulary bad split") when encoding.
        for (pattern, id) in normalizer.marker_patterns() {
            if pattern.is_empty() {
                bail!(
                    "tokenizer piece {id} is a user-defined symbol ({:?}) that normalizes to nothing",
                    pieces[id as usize].text
                );
            }
        }
        let mut dummy_prefix_ids = Vec::new();
        bpe.tokenize(&SPACE.to_string(), &mut dummy_prefix_ids);
        Ok(NeedleTokenizer {
            bpe,
            normalizer,
            merges,
            unk_id: special.unk,
            byte_fallback,
            pieces,
            pad_id: special.pad,
            eos_id: special.eos,
            bos_id: special.bos,
            add_dummy_prefix,
            remove_extra_whitespaces,
            dummy_prefix_ids,
        })
    }

    /// Token ids of `text` as sentencepiece's `Encode` gives them (no BOS/EOS).
    /// A text that is exactly one chat marker normalizes to that marker's own
    /// added-token pattern, which leaves HF no room for sentencepiece's dummy
    /// `▁`; it is put back here.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let normalized = self.normalizer.normalize(text);
        let mut ids = Vec::new();
        for segment in self.normalizer.split(&normalized) {
            match segment {
                Segment::Text(word) => self.bpe.tokenize(word, &mut ids),
                Segment::Marker(id) => ids.push(id),
            }
        }
        match ids[..] {
            [id] if self.add_dummy_prefix && self.is_marker(id) => {
                [self.dummy_prefix_ids.as_slice(), &[id]].concat()
            }
            _ => ids,
        }
    }

    /// Text of `ids` as sentencepiece's `Decode` gives it: byte pieces are
    /// reassembled (U+FFFD per invalid byte), `▁` becomes a space, the leading
    /// dummy-prefix space is dropped, control pieces vanish and `<unk>` reads
    /// ` ⁇ `. Ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut text = String::new();
        let mut bytes = Vec::new();
        let mut at_start = true;
        let mut prefix_consumed = false;
        for piece in ids.iter().filter_map(|&id| self.pieces.get(id as usize)) {
            if let Some(byte) = piece.byte_value() {
                bytes.push(byte);
                continue;
            }
            push_bytes(&mut text, &mut bytes);
            if prefix_consumed || !text.is_empty() {
                at_start = false;
            }
            let (surface, consumed) = self.surface(piece, at_start);
            prefix_consumed = consumed;
            text.push_str(&surface);
        }
        push_bytes(&mut text, &mut bytes);
        text
    }

    /// The tokenizer as a `tokenizer.json` document (HF `tokenizers` format).
    /// Loaded by HF `tokenizers`, it encodes like [`Self::encode`] except that a
    /// text consisting of exactly one chat marker lacks the leading `▁` token.
    pub fn to_json(&self) -> String {
        let document = Document {
            pieces: self.pieces.iter().map(|p| p.text.clone()).collect(),
            merges: self.merges.clone(),
            markers: (0..self.pieces.len() as u32)
                .filter(|&id| self.is_marker(id))
                .collect(),
            unk: self.unk_id,
            byte_fallback: self.byte_fallback,
        };
        document.write(&self.normalizer, self.add_dummy_prefix)
    }

    /// What each id adds to the text in the middle of a text, by id: its bytes (`▁` as a
    /// space, a byte piece as its byte, a chat marker as spelled), or `None` for the control
    /// pieces and `<unk>`, which stand for no text.
    pub fn text_bytes(&self) -> Vec<Option<Vec<u8>>> {
        self.pieces
            .iter()
            .map(|piece| match piece.kind {
                PieceKind::Control | PieceKind::Unknown => None,
                PieceKind::Byte => piece.byte_value().map(|b| vec![b]),
                PieceKind::Normal | PieceKind::UserDefined => {
                    Some(piece.text.replace(SPACE, " ").into_bytes())
                }
            })
            .collect()
    }

    /// Number of pieces.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Id of the piece spelled `piece` (e.g. `<|im_end|>`), if any.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.bpe.id(piece)
    }

    /// `<s>`, prepended to every model input.
    pub fn bos_id(&self) -> u32 {
        self.bos_id
    }

    /// `</s>`, where generation stops.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// `<pad>`.
    pub fn remove_extra_whitespaces(&self) -> bool {
        self.remove_extra_whitespaces
    }

    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Whether `id` is a byte-fallback piece (`<0xHH>`), whose text may be part of a
    /// character that the next pieces complete.
    pub fn is_byte_piece(&self, id: u32) -> bool {
        self.pieces
            .get(id as usize)
            .is_some_and(|p| p.kind == PieceKind::Byte)
    }

    /// Whether `id` is a chat marker (a user-defined piece, matched verbatim).
    pub fn is_marker(&self, id: u32) -> bool {
        self.pieces
            .get(id as usize)
            .is_some_and(|p| p.kind == PieceKind::UserDefined)
    }

    /// sentencepiece's `DecodeSentencePiece`: the surface of one non-byte
    /// piece, and whether it consumed the dummy-prefix `▁`.
    fn surface(&self, piece: &Piece, at_start: bool) -> (String, bool) {
        match piece.kind {
            PieceKind::Control => (String::new(), false),
            PieceKind::Unknown => (UNK_SURFACE.to_string(), false),
            _ => {
                let mut text = piece.text.as_str();
                let mut consumed = false;
                if at_start && (self.add_dummy_prefix || self.remove_extra_whitespaces) {
                    if let Some(rest) = text.strip_prefix(SPACE) {
                        text = rest;
                        consumed = !self.remove_extra_whitespaces;
                    }
                }
                (text.replace(SPACE, " "), consumed)
            }
        }
    }
}

/// BPE merges as HF converts a SentencePiece BPE model: every split of a normal
/// piece into two normal pieces, ranked by the merged piece's score (higher
/// first), ties broken by piece id, then by the ids of the two halves.
fn merges(pieces: &[Piece]) -> Vec<(String, String)> {
    let normal: HashMap<&str, usize> = pieces
        .iter()
        .enumerate()
        .filter(|(_, p)| p.kind == PieceKind::Normal)
        .map(|(id, p)| (p.text.as_str(), id))
        .collect();
    let mut ranked: Vec<(f32, usize, usize, usize, &str, &str)> = Vec::new();
    for (&text, &id) in &normal {
        for (split, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(split);
            if let (Some(&l), Some(&r)) = (normal.get(left), normal.get(right)) {
                ranked.push((pieces[id].score, id, l, r, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    ranked
        .into_iter()
        .map(|(.., left, right)| (left.to_string(), right.to_string()))
        .collect()
}

/// Appends pending byte pieces as UTF-8, one U+FFFD per invalid byte.
fn push_bytes(text: &mut String, bytes: &mut Vec<u8>) {
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                text.push_str(valid);
                rest = &[];
            }
            Err(error) => {
                let (valid, invalid) = rest.split_at(error.valid_up_to());
                text.push_str(std::str::from_utf8(valid).expect("checked by valid_up_to"));
                text.push(char::REPLACEMENT_CHARACTER);
                rest = &invalid[1..];
            }
        }
    }
    bytes.clear();
}
