//! The 120-byte Needle 2 header (29 u32 + f32 `rope_theta`) and the codebooks after it.

use super::layout::HEADER;
use crate::cact::codebooks::{read_codebooks, Codebooks};
use crate::cact::header::{CommonHeader, HeaderRules, RawHeader};
use crate::cact::CactError;
use graphs::contract::Generation;

/// The header, field for field, after validation.
#[derive(Clone, Debug, PartialEq)]
pub struct Needle2Header {
    /// The fields Needle 3 stores too.
    pub common: CommonHeader,
    /// Width of every head (queries, keys and values).
    pub head_dim: u32,
}

/// Needle 2's sizes beside the common ones (its one head width) and its RoPE width.
const RULES: HeaderRules = HeaderRules {
    sizes: &["num_layers", "head_dim"],
    rope_head: "head_dim",
};

impl Needle2Header {
    /// Reads and validates the header and codebooks at the start of `file` (whose tag
    /// must be Needle 2's); also returns the header's bytes for the tensor walk.
    pub(crate) fn parse(
        file: &[u8],
    ) -> Result<(Needle2Header, RawHeader<'_>, Codebooks), CactError> {
        let (raw, mut r) = RawHeader::read(file, Generation::Needle2, HEADER)?;
        let header = Needle2Header {
            common: CommonHeader::read(&raw, &RULES)?,
            head_dim: raw.u32("head_dim"),
        };
        let codebooks = read_codebooks(&mut r)?;
        Ok((header, raw, codebooks))
    }
}
