//! The tensors of a parsed file: its validated directory and its bytes, each tensor
//! decoded on request, exactly like upstream `read_export`.

use std::sync::Arc;

use graphs::blocks::weights::{CqRows, Tensor};

use super::codebooks::Codebooks;
use super::cq;
use super::directory::Entry;
use super::CactError;

/// A file's directory and bytes. Built only from entries the directory walk validated
/// against these bytes, so every blob is in range.
#[derive(Clone)]
pub(crate) struct Tensors {
    entries: Vec<Entry>,
    codebooks: Codebooks,
    bytes: Vec<u8>,
}

impl Tensors {
    pub(crate) fn new(entries: Vec<Entry>, codebooks: Codebooks, bytes: Vec<u8>) -> Self {
        Tensors {
            entries,
            codebooks,
            bytes,
        }
    }

    /// Every tensor in file order.
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn codebooks(&self) -> &Codebooks {
        &self.codebooks
    }

    /// Size of the file in bytes.
    pub(crate) fn file_len(&self) -> usize {
        self.bytes.len()
    }

    /// The entry with upstream name `name`.
    pub(crate) fn entry(&self, name: &str) -> Result<&Entry, CactError> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| CactError::Missing {
                tensor: name.to_string(),
            })
    }

    /// The float32 values of tensor `name` (and its CQ codes when it is CQ).
    pub(crate) fn tensor(&self, name: &str) -> Result<Tensor, CactError> {
        let entry = self.entry(name)?;
        let blob = entry.blob(&self.bytes);
        Ok(Tensor {
            shape: entry.shape.clone(),
            data: cq::decode(entry, blob, &self.codebooks)?,
            codes: cq::rows(entry, blob, &self.codebooks)?.map(Arc::new),
        })
    }

    /// The codes and norms of CQ tensor `name` as stored (`None` when it is not CQ).
    pub(crate) fn cq_rows(&self, name: &str) -> Result<Option<CqRows>, CactError> {
        let entry = self.entry(name)?;
        cq::rows(entry, entry.blob(&self.bytes), &self.codebooks)
    }
}
