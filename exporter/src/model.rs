//! A Needle model read from a file, whatever its generation: the one place that picks
//! the reader for the generation a `.cact` tag names.

use crate::cact::{file_generation, CactError, Needle2File, Needle3File, TokenizerSpec};
use anyhow::Context;
use graphs::config::ModelConfig;
use graphs::contract::Generation;
use graphs::description::Source;
use graphs::model::ModelWeights;
use sha2::{Digest, Sha256};
use std::path::Path;

/// A model ready to export: geometry, dequantized float32 weights, tokenizer, provenance.
#[derive(Clone, Debug)]
pub struct NeedleModel {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: TokenizerSpec,
    pub source: Source,
    /// Tensors of a Whistle audio section the file carries, which the export leaves out.
    pub skipped_audio_tensors: usize,
}

impl NeedleModel {
    /// Reads a whole `.cact` file held in memory, named `file_name` in the graph's
    /// provenance; validates it completely and dequantizes its weights.
    pub fn from_bytes(file_name: &str, bytes: &[u8]) -> Result<Self, CactError> {
        let source = source_of(file_name, bytes);
        match file_generation(bytes)? {
            Generation::Needle2 => {
                let file = Needle2File::parse(bytes)?;
                Ok(NeedleModel {
                    config: ModelConfig::Needle2(file.config()),
                    weights: ModelWeights::Needle2(Box::new(file.weights()?)),
                    tokenizer: file.tokenizer().clone(),
                    source,
                    skipped_audio_tensors: 0,
                })
            }
            Generation::Needle3 => {
                let file = Needle3File::parse(bytes)?;
                Ok(NeedleModel {
                    config: ModelConfig::Needle3(file.config()),
                    weights: ModelWeights::Needle3(Box::new(file.weights()?)),
                    tokenizer: file.tokenizer().clone(),
                    source,
                    skipped_audio_tensors: file.audio_tensors(),
                })
            }
        }
    }

    pub fn generation(&self) -> Generation {
        self.config.generation()
    }

    /// The `depth`-layer ladder rung of a Needle 3 model, the blocks chosen as upstream
    /// chooses them (`ladder_layer_indices`); `depth` = the model's depth is the model.
    pub fn rung(self, depth: usize) -> Result<Self, String> {
        match (self.config, self.weights) {
            (ModelConfig::Needle3(config), ModelWeights::Needle3(weights)) => {
                let (config, weights) = graphs::needle3::ladder::rung(&config, &weights, depth)?;
                Ok(NeedleModel {
                    config: ModelConfig::Needle3(config),
                    weights: ModelWeights::Needle3(Box::new(weights)),
                    ..self
                })
            }
            _ => Err(
                "--layers picks a ladder rung of a Needle 3 model; this is a Needle 2 \
                      file, which has no ladder"
                    .to_string(),
            ),
        }
    }

    /// Reads the `.cact` file at `path` (see [`Self::from_bytes`]); the error names the path.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_file_bytes(path, &bytes)
    }

    /// [`Self::read`] of a file whose `bytes` the caller has read already.
    pub fn from_file_bytes(path: &Path, bytes: &[u8]) -> anyhow::Result<Self> {
        // Name the generation in errors once the tag says which it is.
        let what = match file_generation(bytes) {
            Ok(g) => format!("{} (Needle {g})", path.display()),
            Err(_) => path.display().to_string(),
        };
        Self::from_bytes(&file_name(path), bytes).with_context(|| what)
    }
}

/// Names the source and hashes its bytes.
pub fn source_of(file_name: &str, bytes: &[u8]) -> Source {
    Source {
        file_name: file_name.to_string(),
        sha256: sha256_hex(bytes),
    }
}

/// Lowercase hex SHA-256 of `bytes` (the checksums graphs record).
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The last component of `path` as text (empty when it has none).
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
