//! Everything that can be wrong with a `.cact` file, each case naming the
//! field or tensor (by its upstream name) and the byte offset in the file.

use graphs::contract::Generation;
use std::fmt;

/// Why a `.cact` file was rejected. `Display` is one line; every `offset` is
/// a byte offset from the start of the file.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CactError {
    /// The file could not be read from disk.
    Io { path: String, message: String },
    /// No tensor of this name exists in the file (a caller error).
    Missing { tensor: String },
    /// The file (or the blob holding `what`) ends before `what` is complete.
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// The first u32 is no generation's tag (`0x05E12A83` Needle 2, `0x05E12A84` Needle 3).
    BadTag { found: u32 },
    /// A generation's reader was handed another generation's file.
    OtherGeneration {
        found: Generation,
        reader: Generation,
    },
    /// A header field has a value the architecture cannot have.
    Header {
        field: &'static str,
        offset: u64,
        value: String,
        expected: String,
    },
    /// A codebook entry is not finite or breaks the ascending order.
    Codebook {
        index: usize,
        offset: u64,
        found: f32,
    },
    /// `num_tensors` does not fit the header geometry.
    TensorCount {
        offset: u64,
        found: u64,
        expected: String,
    },
    /// A directory record has a dtype this tensor cannot have.
    Dtype {
        tensor: String,
        offset: u64,
        found: u8,
        expected: &'static str,
    },
    /// A directory record has a different number of dimensions than the slot needs.
    Ndim {
        tensor: String,
        offset: u64,
        found: u8,
        expected: usize,
    },
    /// A directory record's shape differs from the one the geometry implies.
    Shape {
        tensor: String,
        offset: u64,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    /// A blob's byte length differs from what its dtype and shape need.
    NBytes {
        tensor: String,
        offset: u64,
        found: u64,
        expected: u64,
    },
    /// A blob reaches past the end of the file.
    BlobOutOfBounds {
        tensor: String,
        offset: u64,
        start: u64,
        nbytes: u64,
        file_len: u64,
    },
    /// A blob does not start on a 64-byte boundary.
    Misaligned {
        tensor: String,
        offset: u64,
        start: u64,
    },
    /// A blob overlaps the header/directory or another tensor's blob.
    Overlap {
        tensor: String,
        offset: u64,
        start: u64,
        other: String,
    },
    /// A CQ record's `bits` is not one its generation stores.
    Bits {
        tensor: String,
        offset: u64,
        found: u32,
        expected: &'static str,
    },
    /// A CQ record's group size is not a power of two in `8..=1024`.
    Group {
        tensor: String,
        offset: u64,
        found: u32,
    },
    /// `heads.manifest` holds something other than distinct head codes 1 or 2.
    HeadCode {
        offset: u64,
        index: usize,
        found: f32,
        expected: &'static str,
    },
    /// A Monarch permutation entry is not an unused index below its length.
    Permutation {
        tensor: String,
        offset: u64,
        index: usize,
        found: f32,
    },
    /// `heads.manifest` lists no heads or more than the generation has.
    HeadCount { offset: u64, found: u64, most: u64 },
    /// The tensor after the heads is not a Whistle `audio.manifest`.
    AudioManifest { offset: u64, found: String },
    /// A ternary CQ tensor holds the unused crumb code 2 (`index` is the element).
    TernaryCode {
        tensor: String,
        offset: u64,
        index: usize,
    },
    /// A dequantized value is NaN or infinite; `offset` is the FP16/FP32
    /// element or CQ group norm it came from.
    NonFinite {
        tensor: String,
        offset: u64,
        index: usize,
    },
    /// The tokenizer declares a different number of pieces than the header vocab.
    TokenizerVocab { offset: u64, found: u32, vocab: u32 },
    /// A tokenizer flag byte is neither 0 nor 1.
    TokenizerFlag {
        field: &'static str,
        offset: u64,
        found: u8,
    },
    /// A special-token id (`pad_id`, ...) is not a piece id.
    TokenizerSpecialId {
        field: &'static str,
        offset: u64,
        id: u32,
        n_pieces: u32,
    },
    /// A piece's type byte is not 0..=4.
    TokenizerPieceType { piece: u32, offset: u64, found: u8 },
    /// A piece's text is not UTF-8.
    TokenizerUtf8 { piece: u32, offset: u64 },
    /// A BYTE piece's text is not of the form `<0xHH>`.
    TokenizerBytePiece {
        piece: u32,
        offset: u64,
        text: String,
    },
    /// Bytes are left in the tokenizer blob after the last declared piece.
    TokenizerTrailing { offset: u64, extra: u64 },
}

impl fmt::Display for CactError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CactError::*;
        match self {
            Io { path, message } => write!(f, "cannot read {path}: {message}"),
            Missing { tensor } => write!(f, "no tensor named {tensor} in this file"),
            Truncated {
                what,
                offset,
                needed,
                available,
            } => write!(
                f,
                "truncated: {what} at byte {offset} needs {needed} bytes, only {available} left"
            ),
            BadTag { found } => write!(
                f,
                "not a Needle .cact file: tag {found:#010x} at byte 0, expected 0x05e12a83 \
                 (Needle 2) or 0x05e12a84 (Needle 3)"
            ),
            OtherGeneration { found, reader } => write!(
                f,
                "this is a Needle {found} .cact file; the Needle {reader} reader cannot read it"
            ),
            Header {
                field,
                offset,
                value,
                expected,
            } => write!(
                f,
                "header field {field} at byte {offset} is {value}, expected {expected}"
            ),
            Codebook {
                index,
                offset,
                found,
            } => write!(
                f,
                "codebook entry {index} at byte {offset} is {found}; each codebook must be finite and ascending"
            ),
            TensorCount {
                offset,
                found,
                expected,
            } => write!(
                f,
                "header field num_tensors at byte {offset} is {found}, expected {expected}"
            ),
            Dtype {
                tensor,
                offset,
                found,
                expected,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): dtype {found}, expected {expected}"
            ),
            Ndim {
                tensor,
                offset,
                found,
                expected,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): ndim {found}, expected {expected}"
            ),
            Shape {
                tensor,
                offset,
                found,
                expected,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): shape {found:?}, the header geometry needs {expected:?}"
            ),
            NBytes {
                tensor,
                offset,
                found,
                expected,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): nbytes {found}, dtype and shape need {expected}"
            ),
            BlobOutOfBounds {
                tensor,
                offset,
                start,
                nbytes,
                file_len,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): blob of {nbytes} bytes at byte {start} ends past the end of the {file_len}-byte file"
            ),
            Misaligned {
                tensor,
                offset,
                start,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): blob at byte {start} is not 64-byte aligned"
            ),
            Overlap {
                tensor,
                offset,
                start,
                other,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): blob at byte {start} overlaps {other}"
            ),
            Bits {
                tensor,
                offset,
                found,
                expected,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): CQ bits {found}, expected {expected}"
            ),
            Group {
                tensor,
                offset,
                found,
            } => write!(
                f,
                "{tensor} (record at byte {offset}): CQ group size {found}, expected a power of two from 8 to 1024"
            ),
            HeadCode {
                offset,
                index,
                found,
                expected,
            } => write!(
                f,
                "heads.manifest entry {index} at byte {offset} is {found}, expected {expected}"
            ),
            Permutation {
                tensor,
                offset,
                index,
                found,
            } => write!(
                f,
                "{tensor} entry {index} at byte {offset} is {found}, expected a permutation of 0..len"
            ),
            HeadCount { offset, found, most } => write!(
                f,
                "heads.manifest (record at byte {offset}) lists {found} heads, expected 1 to {most}"
            ),
            AudioManifest { offset, found } => write!(
                f,
                "the record at byte {offset} after the probe heads is {found}, expected the \
                 Whistle audio.manifest (13 FP32 values starting with 3246) or the tokenizer"
            ),
            TernaryCode {
                tensor,
                offset,
                index,
            } => write!(
                f,
                "{tensor}: element {index} (byte {offset}) has ternary crumb code 2; only 3, 0, 1 are trits"
            ),
            NonFinite {
                tensor,
                offset,
                index,
            } => write!(
                f,
                "{tensor}: element {index} is not finite (from the value at byte {offset})"
            ),
            TokenizerVocab {
                offset,
                found,
                vocab,
            } => write!(
                f,
                "tokenizer n_pieces at byte {offset} is {found}, but the header vocab is {vocab}"
            ),
            TokenizerFlag {
                field,
                offset,
                found,
            } => write!(
                f,
                "tokenizer {field} at byte {offset} is {found}, expected 0 or 1"
            ),
            TokenizerSpecialId {
                field,
                offset,
                id,
                n_pieces,
            } => write!(
                f,
                "tokenizer {field} at byte {offset} is {id}, not below n_pieces {n_pieces}"
            ),
            TokenizerPieceType {
                piece,
                offset,
                found,
            } => write!(
                f,
                "tokenizer piece {piece} at byte {offset}: type {found}, expected 0..=4"
            ),
            TokenizerUtf8 { piece, offset } => write!(
                f,
                "tokenizer piece {piece} at byte {offset}: text is not valid UTF-8"
            ),
            TokenizerBytePiece {
                piece,
                offset,
                text,
            } => write!(
                f,
                "tokenizer piece {piece} at byte {offset}: BYTE piece {text:?} is not <0xHH>"
            ),
            TokenizerTrailing { offset, extra } => write!(
                f,
                "tokenizer: {extra} bytes left at byte {offset} after the last declared piece"
            ),
        }
    }
}

impl std::error::Error for CactError {}
