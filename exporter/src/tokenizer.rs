//! The SentencePiece BPE tokenizer of a `.cact`, rebuilt on the `tokenizers`
//! crate so that it encodes exactly like `sentencepiece`'s `Encode` and can be
//! written out as a `tokenizer.json`.
//!
//! Encoding, as sentencepiece does it:
//! 1. optional whitespace rule (`remove_extra_whitespaces`): drop leading U+0020,
//!    collapse runs of U+0020, strip trailing U+0020 and `▁`;
//! 2. spaces become `▁`, and a dummy `▁` is prepended (`add_dummy_prefix`);
//! 3. the chat markers (USER_DEFINED pieces) are cut out wherever they occur;
//! 4. every other stretch is BPE-merged by piece score, with byte fallback.
//!
//! Steps 1–2 are normalizers and step 3 uses normalized added tokens, so all of
//! it lands in the serialized `tokenizer.json`.

use crate::cact::tokenizer_blob::{Piece, PieceKind, TokenizerSpec};
use anyhow::{bail, Result};
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Prepend, Replace, Sequence};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizedString, Normalizer, NormalizerWrapper, Tokenizer,
};

const SPACE: char = '▁';
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
    inner: Tokenizer,
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
        let vocab: Vocab = spec
            .pieces
            .iter()
            .enumerate()
            .map(|(id, piece)| (piece.text.clone(), id as u32))
            .collect();
        if vocab.len() != spec.pieces.len() {
            bail!("tokenizer blob has duplicate piece texts");
        }
        let Some(unk) = spec.pieces.get(spec.unk_id as usize) else {
            bail!("tokenizer unk_id {} is not a piece id", spec.unk_id);
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges(&spec.pieces))
            .unk_token(unk.text.clone())
            .byte_fallback(spec.byte_fallback)
            .build()
            .map_err(anyhow::Error::msg)?;

        let markers: Vec<&str> = spec
            .pieces
            .iter()
            .filter(|p| p.kind == PieceKind::UserDefined)
            .map(|p| p.text.as_str())
            .collect();
        let normalizer = normalizer(&markers, spec.add_dummy_prefix, remove_extra_whitespaces)?;
        // HF matches added tokens by their normalized form: one that normalizes
        // to nothing (e.g. `▁` or "") would match the empty string, on which
        // `tokenizers` panics ("AddedVocabulary bad split") when encoding.
        for (id, piece) in spec.pieces.iter().enumerate() {
            if piece.kind == PieceKind::UserDefined {
                let mut normalized = NormalizedString::from(piece.text.as_str());
                normalizer
                    .normalize(&mut normalized)
                    .map_err(anyhow::Error::msg)?;
                if normalized.get().is_empty() {
                    bail!(
                        "tokenizer piece {id} is a user-defined symbol ({:?}) that normalizes to nothing",
                        piece.text
                    );
                }
            }
        }
        let mut inner = Tokenizer::new(bpe);
        inner.with_normalizer(Some(normalizer));
        inner.with_decoder(Some(decoder(spec.add_dummy_prefix)));
        let added: Vec<AddedToken> = markers
            .iter()
            .map(|m| AddedToken::from(*m, false).normalized(true))
            .collect();
        inner.add_tokens(&added);

        let special = SpecialIds {
            pad: spec.pad_id,
            eos: spec.eos_id,
            bos: spec.bos_id,
            unk: spec.unk_id,
        };
        Self::assemble(
            inner,
            spec.pieces.clone(),
            special,
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
        let inner: Tokenizer = json.parse().map_err(anyhow::Error::msg)?;
        let markers: Vec<u32> = inner.get_added_tokens_decoder().keys().copied().collect();
        let size = inner.get_vocab_size(true) as u32;
        let pieces = (0..size)
            .map(|id| {
                let text = inner.id_to_token(id).unwrap_or_default();
                let kind = if id == special.unk {
                    PieceKind::Unknown
                } else if [special.pad, special.eos, special.bos].contains(&id) {
                    PieceKind::Control
                } else if markers.contains(&id) {
                    PieceKind::UserDefined
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
        Self::assemble(
            inner,
            pieces,
            special,
            add_dummy_prefix,
            remove_extra_whitespaces,
        )
    }

    fn assemble(
        inner: Tokenizer,
        pieces: Vec<Piece>,
        special: SpecialIds,
        add_dummy_prefix: bool,
        remove_extra_whitespaces: bool,
    ) -> Result<Self> {
        let dummy_prefix_ids = inner
            .get_model()
            .tokenize(&SPACE.to_string())
            .map_err(anyhow::Error::msg)?
            .iter()
            .map(|t| t.id)
            .collect();
        Ok(NeedleTokenizer {
            inner,
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
        let ids = self
            .inner
            .encode(text, false)
            .expect("the normalizers and the BPE model of a built tokenizer cannot fail")
            .get_ids()
            .to_vec();
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
        self.inner
            .to_string(false)
            .expect("a tokenizer with string-keyed maps always serializes")
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
        self.inner.token_to_id(piece)
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

/// Steps 1–2 of the module docs. The last step undoes the dummy prefix on a
/// text that is exactly one marker: HF normalizes each marker with this same
/// normalizer to get the pattern it matches, and that pattern must stay the
/// bare marker.
fn normalizer(
    markers: &[&str],
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
) -> Result<NormalizerWrapper> {
    let regex = |pattern: String, content: &str| -> Result<NormalizerWrapper> {
        Ok(Replace::new(ReplacePattern::Regex(pattern), content)
            .map_err(anyhow::Error::msg)?
            .into())
    };
    let mut steps = Vec::new();
    if remove_extra_whitespaces {
        steps.push(regex(" {2,}".into(), " ")?);
        steps.push(regex(r"\A ".into(), "")?);
        steps.push(regex(format!("(?<![ {SPACE}])[ {SPACE}]+\\z"), "")?);
    }
    steps.push(
        Replace::new(" ", SPACE.to_string())
            .map_err(anyhow::Error::msg)?
            .into(),
    );
    if add_dummy_prefix {
        steps.push(Prepend::new(SPACE.to_string()).into());
        if !markers.is_empty() {
            let alternatives: Vec<String> = markers.iter().map(|m| regex_escape(m)).collect();
            steps.push(regex(
                format!("\\A{SPACE}(?=(?:{})\\z)", alternatives.join("|")),
                "",
            )?);
        }
    }
    Ok(Sequence::new(steps).into())
}

/// The decoder HF uses for SentencePiece BPE models, for users of the
/// serialized `tokenizer.json`; [`NeedleTokenizer::decode`] ports
/// sentencepiece's own rules instead.
fn decoder(add_dummy_prefix: bool) -> DecoderWrapper {
    let mut steps: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE.to_string(), " ")
            .expect("a literal pattern always compiles")
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_dummy_prefix {
        steps.push(Strip::new(' ', 1, 0).into());
    }
    DecoderSequence::new(steps).into()
}

/// `text` as a regex that matches it literally (the escapes onig and ECMAScript share).
pub(crate) fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\^$.|?*+()[]{}".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
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
