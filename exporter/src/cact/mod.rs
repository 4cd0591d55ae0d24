//! Reader for Needle 2 `.cact` files (`cactus-needle==2.0.15`,
//! `needle/model/export.py`), validated completely before anything is
//! dequantized. The byte layout is declared in [`layout`].

pub(crate) mod bytes;
mod cq;
pub mod directory;
pub mod error;
pub mod header;
pub mod layout;
pub mod needle3;
pub mod tokenizer_blob;
mod weights;

use std::path::Path;
use std::sync::Arc;

use graphs::blocks::weights::Tensor;

use directory::{check_overlaps, DirectoryWalk, Slot, NEEDLE2_CQ};
pub use directory::{Encoding, Entry};
pub use error::CactError;
pub use graphs::needle2::{HeadKind, ProbeHead};
pub use header::{Codebooks, Header};
use layout::{directory_start, header_offset, RECORD_BYTES};
pub use tokenizer_blob::{Piece, PieceKind, TokenizerSpec};

/// The first u32 of a `.cact` file, which names its generation; `r` is at its start.
pub(crate) fn read_tag(r: &mut bytes::Reader<'_>) -> Result<u32, CactError> {
    r.u32(|| "header tag".to_string())
}

/// A parsed and validated Needle 2 `.cact` file. Owns the file's bytes;
/// tensors are decoded on request ([`CactFile::weights`], [`CactFile::tensor`]).
#[derive(Clone)]
pub struct CactFile {
    header: Header,
    codebooks: Codebooks,
    entries: Vec<Entry>,
    heads: Vec<HeadKind>,
    tokenizer: TokenizerSpec,
    bytes: Vec<u8>,
}

impl CactFile {
    /// Parses and validates a whole `.cact` file held in memory.
    pub fn parse(bytes: &[u8]) -> Result<Self, CactError> {
        let parsed = Parsed::parse(bytes)?;
        Ok(parsed.into_file(bytes.to_vec()))
    }

    /// Reads and parses the `.cact` file at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, CactError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| CactError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let parsed = Parsed::parse(&bytes)?;
        Ok(parsed.into_file(bytes))
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The 2/3/4-bit codebooks stored after the header.
    pub fn codebooks(&self) -> &Codebooks {
        &self.codebooks
    }

    /// Every tensor in file order, named as upstream names it.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The probe heads listed in `heads.manifest`, in file order (empty when none).
    pub fn head_kinds(&self) -> &[HeadKind] {
        &self.heads
    }

    /// The tokenizer carried in the RAW `tokenizer` blob.
    pub fn tokenizer(&self) -> &TokenizerSpec {
        &self.tokenizer
    }

    /// The float32 values of the tensor with upstream name `name` (e.g.
    /// `layer03.k_proj`, `[out, in]`), CQ tensors dequantized exactly like
    /// upstream `read_export`.
    pub fn tensor(&self, name: &str) -> Result<Tensor, CactError> {
        named_tensor(&self.entries, &self.bytes, &self.codebooks, name)
    }
}

/// The float32 values of the entry named `name` among `entries` of `file`.
pub(crate) fn named_tensor(
    entries: &[Entry],
    file: &[u8],
    codebooks: &Codebooks,
    name: &str,
) -> Result<Tensor, CactError> {
    let entry = entries
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| CactError::Missing {
            tensor: name.to_string(),
        })?;
    let blob = entry.blob(file);
    Ok(Tensor {
        shape: entry.shape.clone(),
        data: cq::decode(entry, blob, codebooks)?,
        codes: cq::rows(entry, blob, codebooks)?.map(Arc::new),
    })
}

impl std::fmt::Debug for CactFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CactFile")
            .field("header", &self.header)
            .field("tensors", &self.entries.len())
            .field("heads", &self.heads)
            .field("vocab", &self.tokenizer.pieces.len())
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// Everything `parse` learns before it takes ownership of the bytes.
struct Parsed {
    header: Header,
    codebooks: Codebooks,
    entries: Vec<Entry>,
    heads: Vec<HeadKind>,
    tokenizer: TokenizerSpec,
}

impl Parsed {
    fn into_file(self, bytes: Vec<u8>) -> CactFile {
        CactFile {
            header: self.header,
            codebooks: self.codebooks,
            entries: self.entries,
            heads: self.heads,
            tokenizer: self.tokenizer,
            bytes,
        }
    }

    fn parse(file: &[u8]) -> Result<Parsed, CactError> {
        let file_len = file.len() as u64;
        let (header, raw_header, codebooks) = Header::parse(file)?;
        let core = layout::core_count(&layout::CORE_WALK, &raw_header);
        let num_tensors = header.num_tensors as u64;
        let head_count = match num_tensors.checked_sub(core + 1) {
            Some(0) => 0,
            Some(4) => 1,
            Some(7) => 2,
            _ => {
                return Err(CactError::TensorCount {
                    offset: header_offset("num_tensors"),
                    found: num_tensors,
                    expected: format!(
                        "{} (through the tokenizer), {} with one probe head or {} with two",
                        core + 1,
                        core + 5,
                        core + 8
                    ),
                })
            }
        };
        let dir_start = directory_start(header.codebook_len);
        let data_start = dir_start + num_tensors * RECORD_BYTES;
        if data_start > file_len {
            return Err(CactError::Truncated {
                what: format!("directory of {num_tensors} records"),
                offset: dir_start,
                needed: num_tensors * RECORD_BYTES,
                available: file_len.saturating_sub(dir_start),
            });
        }

        let mut walk = DirectoryWalk::new(file, dir_start, num_tensors, NEEDLE2_CQ);
        for slot in layout::core_slots(&layout::CORE_WALK, &raw_header)? {
            walk.next(|_| slot)?;
        }
        let mut heads = Vec::new();
        if head_count > 0 {
            let i = walk.next(|_| Slot::float("heads.manifest", &[head_count]))?;
            let manifest = &walk.entries[i];
            let codes = cq::decode(manifest, manifest.blob(file), &codebooks)?;
            heads = weights::head_kinds(manifest, &codes)?;
            let d = header.d_model as u64;
            for kind in &heads {
                let name = kind.name();
                let p =
                    walk.next(|r| Slot::float(format!("{name}.probes"), &[r.dims[0].into(), d]))?;
                let probes = walk.entries[p].shape[0] as u64;
                // The confidence head is one logit (upstream `Dense(1)`).
                let j = walk.next(|r| {
                    let out = match kind {
                        HeadKind::Confidence => 1,
                        HeadKind::Contrastive => r.dims[0].into(),
                    };
                    Slot::float(format!("{name}.proj"), &[out, probes * d])
                })?;
                let out = walk.entries[j].shape[0] as u64;
                walk.next(|_| Slot::float(format!("{name}.bias"), &[out]))?;
            }
        }
        let t = walk.next(|_| Slot::raw("tokenizer"))?;
        let entries = walk.entries;
        check_overlaps(&entries)?;

        let blob = &entries[t];
        let tokenizer = TokenizerSpec::parse_at(blob.blob(file), blob.blob_offset)?;
        if tokenizer.pieces.len() as u64 != header.vocab as u64 {
            return Err(CactError::TokenizerVocab {
                offset: blob.blob_offset,
                found: tokenizer.pieces.len() as u32,
                vocab: header.vocab,
            });
        }
        Ok(Parsed {
            header,
            codebooks,
            entries,
            heads,
            tokenizer,
        })
    }
}
