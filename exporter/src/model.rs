//! A Needle model read from a file, whatever its generation: the one place that reads
//! a `.cact` tag and picks the reader for that generation.

use crate::cact::bytes::Reader;
use crate::cact::layout::{NEEDLE3_TAG, TAG};
use crate::cact::{read_tag, CactError, CactFile, TokenizerSpec};
use crate::output::file_name;
use anyhow::Context;
use graphs::contract::{Generation, Source};
use graphs::needle::{Config, Weights};
use sha2::{Digest, Sha256};
use std::path::Path;

/// A model ready to export: geometry, dequantized float32 weights, tokenizer, provenance.
#[derive(Clone, Debug)]
pub struct NeedleModel {
    pub generation: Generation,
    pub config: Config,
    pub weights: Weights,
    pub tokenizer: TokenizerSpec,
    pub source: Source,
}

impl NeedleModel {
    /// Reads a whole `.cact` file held in memory, named `file_name` in the graph's
    /// provenance; validates it completely and dequantizes its weights.
    pub fn from_bytes(file_name: &str, bytes: &[u8]) -> Result<Self, CactError> {
        let source = source_of(file_name, bytes);
        match generation_of(read_tag(&mut Reader::new(bytes, 0))?)? {
            Generation::Needle2 => {
                let file = CactFile::parse(bytes)?;
                Ok(NeedleModel {
                    generation: Generation::Needle2,
                    config: file.config(),
                    weights: file.weights()?,
                    tokenizer: file.tokenizer().clone(),
                    source,
                })
            }
        }
    }

    /// Reads the `.cact` file at `path` (see [`Self::from_bytes`]); the error names the path.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_bytes(&file_name(path), &bytes).with_context(|| path.display().to_string())
    }
}

/// The generation a `.cact` tag names; an error for a generation this build cannot export.
pub fn generation_of(tag: u32) -> Result<Generation, CactError> {
    match tag {
        TAG => Ok(Generation::Needle2),
        NEEDLE3_TAG => Err(CactError::Needle3),
        found => Err(CactError::BadTag { found }),
    }
}

/// Names the source and hashes its bytes.
pub fn source_of(file_name: &str, bytes: &[u8]) -> Source {
    let digest = Sha256::digest(bytes);
    Source {
        file_name: file_name.to_string(),
        sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
    }
}
