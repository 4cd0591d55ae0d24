//! Reader for Needle 2 `.cact` files (`cactus-needle==2.0.15`, `needle/model/export.py`),
//! validated completely before anything is dequantized. The byte layout is declared in
//! [`layout`].

pub mod header;
pub mod layout;
mod weights;

use std::path::Path;

use graphs::blocks::weights::Tensor;
use graphs::needle2::HeadKind;

use crate::cact::bytes::read_file;
use crate::cact::codebooks::Codebooks;
use crate::cact::cq;
use crate::cact::directory::{check_overlaps, DirectoryWalk, Entry, Slot, NEEDLE2_CQ};
use crate::cact::layout::RECORD_BYTES;
use crate::cact::tensors::Tensors;
use crate::cact::tokenizer_blob::TokenizerSpec;
use crate::cact::walk::{core_count, core_slots};
use crate::cact::CactError;
pub use header::Needle2Header;
use layout::{directory_start, header_offset, CORE_WALK};

/// A parsed and validated Needle 2 `.cact` file. Owns the file's bytes; tensors are
/// decoded on request ([`Needle2File::weights`], [`Needle2File::tensor`]).
#[derive(Clone)]
pub struct Needle2File {
    header: Needle2Header,
    heads: Vec<HeadKind>,
    tokenizer: TokenizerSpec,
    tensors: Tensors,
}

impl Needle2File {
    /// Parses and validates a whole Needle 2 `.cact` file held in memory.
    pub fn parse(bytes: &[u8]) -> Result<Self, CactError> {
        Self::from_bytes(bytes.to_vec())
    }

    /// Reads and parses the Needle 2 `.cact` file at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, CactError> {
        Self::from_bytes(read_file(path.as_ref())?)
    }

    /// The validated header.
    pub fn header(&self) -> &Needle2Header {
        &self.header
    }

    /// The 2/3/4-bit codebooks stored after the header.
    pub fn codebooks(&self) -> &Codebooks {
        self.tensors.codebooks()
    }

    /// Every tensor in file order, named as upstream names it.
    pub fn entries(&self) -> &[Entry] {
        self.tensors.entries()
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
        self.tensors.tensor(name)
    }

    fn from_bytes(file: Vec<u8>) -> Result<Self, CactError> {
        let file_len = file.len() as u64;
        let (header, raw, codebooks) = Needle2Header::parse(&file)?;
        let common = &header.common;
        let core = core_count(&CORE_WALK, &raw);
        let num_tensors = common.num_tensors as u64;
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
        let dir_start = directory_start(common.codebook_len);
        let data_start = dir_start + num_tensors * RECORD_BYTES;
        if data_start > file_len {
            return Err(CactError::Truncated {
                what: format!("directory of {num_tensors} records"),
                offset: dir_start,
                needed: num_tensors * RECORD_BYTES,
                available: file_len.saturating_sub(dir_start),
            });
        }

        let mut walk = DirectoryWalk::new(&file, dir_start, num_tensors, NEEDLE2_CQ);
        for slot in core_slots(&CORE_WALK, &raw)? {
            walk.next(|_| slot)?;
        }
        let mut heads = Vec::new();
        if head_count > 0 {
            let i = walk.next(|_| Slot::float("heads.manifest", &[head_count]))?;
            let manifest = &walk.entries[i];
            let codes = cq::decode(manifest, manifest.blob(&file), &codebooks)?;
            heads = weights::head_kinds(manifest, &codes)?;
            let d = common.d_model as u64;
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
        let tokenizer = TokenizerSpec::parse_at(blob.blob(&file), blob.blob_offset)?;
        if tokenizer.pieces.len() as u64 != common.vocab as u64 {
            return Err(CactError::TokenizerVocab {
                offset: blob.blob_offset,
                found: tokenizer.pieces.len() as u32,
                vocab: common.vocab,
            });
        }
        Ok(Needle2File {
            header,
            heads,
            tokenizer,
            tensors: Tensors::new(entries, codebooks, file),
        })
    }
}

impl std::fmt::Debug for Needle2File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Needle2File")
            .field("header", &self.header)
            .field("tensors", &self.entries().len())
            .field("heads", &self.heads)
            .field("vocab", &self.tokenizer.pieces.len())
            .field("bytes", &self.tensors.file_len())
            .finish_non_exhaustive()
    }
}
