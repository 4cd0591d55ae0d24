//! The RAW `tokenizer` blob: a SentencePiece BPE dump (upstream
//! `export._tokenizer_blob` / `parse_tokenizer_blob`).
//!
//! ```text
//! header  u32 n_pieces, u32 pad_id, u32 eos_id, u32 bos_id, u32 unk_id,
//!         u8 add_dummy_prefix, u8 byte_fallback, u16 _pad          (24 bytes)
//! then n_pieces records, in id order:
//!         f32 score, u8 type, u16 len, len bytes of UTF-8          (7 + len bytes)
//! ```

use super::bytes::Reader;
use super::CactError;

const HEADER_BYTES: usize = 24;
const RECORD_BYTES: usize = 7;

/// How SentencePiece treats a piece (the blob's `type` byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PieceKind {
    /// 0: an ordinary piece, produced by BPE merges.
    Normal,
    /// 1: `<unk>`.
    Unknown,
    /// 2: `<pad>`, `<s>`, `</s>`: never produced by encoding, dropped by decoding.
    Control,
    /// 3: a user-defined symbol (the chat markers), matched verbatim before BPE.
    UserDefined,
    /// 4: a byte-fallback piece `<0xHH>`.
    Byte,
}

impl PieceKind {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => PieceKind::Normal,
            1 => PieceKind::Unknown,
            2 => PieceKind::Control,
            3 => PieceKind::UserDefined,
            4 => PieceKind::Byte,
            _ => return None,
        })
    }
}

/// One vocabulary entry; its id is its index in [`TokenizerSpec::pieces`].
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The piece as SentencePiece spells it (`▁` for a space, `<0x41>` for a byte).
    pub text: String,
    /// BPE merge priority: higher merges first.
    pub score: f32,
    pub kind: PieceKind,
}

impl Piece {
    /// The byte a [`PieceKind::Byte`] piece stands for; `None` for other kinds.
    pub fn byte_value(&self) -> Option<u8> {
        if self.kind != PieceKind::Byte {
            return None;
        }
        parse_byte_piece(&self.text)
    }

    /// Whether `text` is spelled like a byte piece, `<0xHH>`.
    pub fn is_byte_text(text: &str) -> bool {
        parse_byte_piece(text).is_some()
    }
}

fn parse_byte_piece(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Everything the `.cact` says about its tokenizer. Validated: every id is a
/// piece id, every piece is UTF-8, every BYTE piece is `<0xHH>`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerSpec {
    pub pieces: Vec<Piece>,
    pub pad_id: u32,
    pub eos_id: u32,
    pub bos_id: u32,
    pub unk_id: u32,
    /// Prepend `▁` to the text before encoding (and drop one leading space when decoding).
    pub add_dummy_prefix: bool,
    /// Encode pieces missing from the vocabulary as their UTF-8 bytes.
    pub byte_fallback: bool,
}

impl TokenizerSpec {
    /// Parses a tokenizer blob on its own (offsets in errors count from its start).
    pub fn parse(blob: &[u8]) -> Result<Self, CactError> {
        Self::parse_at(blob, 0)
    }

    /// Parses the blob that starts at file offset `base`.
    pub(crate) fn parse_at(blob: &[u8], base: u64) -> Result<Self, CactError> {
        let mut r = Reader::new(blob, base);
        let what = || "tokenizer header".to_string();
        let mut h = Reader::new(r.take(HEADER_BYTES, what)?, base);
        let n_pieces = h.u32(what)?;
        let mut ids = [0u32; 4];
        for id in &mut ids {
            *id = h.u32(what)?;
        }
        let add_dummy_prefix = flag(&mut h, "add_dummy_prefix")?;
        let byte_fallback = flag(&mut h, "byte_fallback")?;

        for (i, (field, id)) in ["pad_id", "eos_id", "bos_id", "unk_id"]
            .into_iter()
            .zip(ids)
            .enumerate()
        {
            if id >= n_pieces {
                return Err(CactError::TokenizerSpecialId {
                    field,
                    offset: base + 4 + 4 * i as u64,
                    id,
                    n_pieces,
                });
            }
        }
        let max_pieces = r.remaining() / RECORD_BYTES;
        if n_pieces as usize > max_pieces {
            return Err(CactError::Truncated {
                what: format!("{n_pieces} tokenizer pieces (n_pieces at byte {base})"),
                offset: r.offset(),
                needed: n_pieces as u64 * RECORD_BYTES as u64,
                available: r.remaining() as u64,
            });
        }

        let mut pieces = Vec::with_capacity(n_pieces as usize);
        for id in 0..n_pieces {
            pieces.push(piece(&mut r, id)?);
        }
        if r.remaining() != 0 {
            return Err(CactError::TokenizerTrailing {
                offset: r.offset(),
                extra: r.remaining() as u64,
            });
        }
        let [pad_id, eos_id, bos_id, unk_id] = ids;
        Ok(TokenizerSpec {
            pieces,
            pad_id,
            eos_id,
            bos_id,
            unk_id,
            add_dummy_prefix,
            byte_fallback,
        })
    }
}

fn flag(r: &mut Reader<'_>, field: &'static str) -> Result<bool, CactError> {
    let offset = r.offset();
    match r.u8(|| format!("tokenizer {field}"))? {
        0 => Ok(false),
        1 => Ok(true),
        found => Err(CactError::TokenizerFlag {
            field,
            offset,
            found,
        }),
    }
}

fn piece(r: &mut Reader<'_>, id: u32) -> Result<Piece, CactError> {
    let offset = r.offset();
    let what = || format!("tokenizer piece {id}");
    let score = r.f32(what)?;
    let type_offset = r.offset();
    let code = r.u8(what)?;
    let len = r.u16(what)?;
    let text_offset = r.offset();
    let bytes = r.take(len as usize, what)?;
    let kind = PieceKind::from_code(code).ok_or(CactError::TokenizerPieceType {
        piece: id,
        offset: type_offset,
        found: code,
    })?;
    let text = std::str::from_utf8(bytes)
        .map_err(|_| CactError::TokenizerUtf8 {
            piece: id,
            offset: text_offset,
        })?
        .to_string();
    if kind == PieceKind::Byte && parse_byte_piece(&text).is_none() {
        return Err(CactError::TokenizerBytePiece {
            piece: id,
            offset,
            text,
        });
    }
    Ok(Piece { text, score, kind })
}
