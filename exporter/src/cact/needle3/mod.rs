//! Reader for Needle 3 `.cact` files (`cactus-needle==3.2.8`, `needle/model/export.py`),
//! validated completely before anything is dequantized. The byte layout is declared in
//! [`layout`].

pub mod header;
pub mod layout;
mod weights;

use std::path::Path;

use graphs::blocks::weights::{CqRows, Tensor};
use graphs::needle3::HeadKind;

use crate::cact::bytes::read_file;
use crate::cact::codebooks::Codebooks;
use crate::cact::cq;
use crate::cact::directory::{
    check_overlaps, DirectoryWalk, Encoding, Entry, Record, Slot, NEEDLE3_CQ,
};
use crate::cact::layout::RECORD_BYTES;
use crate::cact::tensors::Tensors;
use crate::cact::tokenizer_blob::TokenizerSpec;
use crate::cact::walk::{core_count, core_slots};
use crate::cact::CactError;
pub use header::Needle3Header;
use layout::{directory_start, header_offset, AUDIO_MAGIC, CORE_WALK};

/// Values in the Whistle `audio.manifest`.
const AUDIO_MANIFEST_LEN: u32 = 13;

/// A parsed and validated Needle 3 `.cact` file. Owns the file's bytes; tensors are
/// decoded on request.
#[derive(Clone)]
pub struct Needle3File {
    header: Needle3Header,
    heads: Vec<HeadKind>,
    audio_tensors: usize,
    tokenizer: TokenizerSpec,
    tensors: Tensors,
}

impl Needle3File {
    /// Parses and validates a whole Needle 3 `.cact` file held in memory.
    pub fn parse(bytes: &[u8]) -> Result<Self, CactError> {
        Self::from_bytes(bytes.to_vec())
    }

    /// Reads and parses the Needle 3 `.cact` file at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, CactError> {
        Self::from_bytes(read_file(path.as_ref())?)
    }

    fn from_bytes(bytes: Vec<u8>) -> Result<Self, CactError> {
        let file = &bytes[..];
        let (header, raw, codebooks) = Needle3Header::parse(file)?;
        let common = &header.common;
        let core = core_count(&CORE_WALK, &raw);
        let num_tensors = u64::from(common.num_tensors);
        if num_tensors < core + 1 {
            return Err(CactError::TensorCount {
                offset: header_offset("num_tensors"),
                found: num_tensors,
                expected: format!("at least {} (through the tokenizer)", core + 1),
            });
        }
        let dir_start = directory_start(common.codebook_len);
        let file_len = file.len() as u64;
        if dir_start + num_tensors * RECORD_BYTES > file_len {
            return Err(CactError::Truncated {
                what: format!("directory of {num_tensors} records"),
                offset: dir_start,
                needed: num_tensors * RECORD_BYTES,
                available: file_len.saturating_sub(dir_start),
            });
        }
        let mut walk = DirectoryWalk::new(file, dir_start, num_tensors, NEEDLE3_CQ);
        for slot in core_slots(&CORE_WALK, &raw)? {
            walk.next(|_| slot)?;
        }
        let last = num_tensors as usize - 1;
        let mut heads = Vec::new();
        if walk.entries.len() < last && !is_audio_manifest(&walk.peek()?) {
            heads = read_heads(&mut walk, file, &codebooks, &header)?;
        }
        let audio_start = walk.entries.len();
        if audio_start < last {
            let manifest = walk.next(|r| Slot::float("audio.manifest", &r.shape()))?;
            check_audio_manifest(&walk.entries[manifest], file, &codebooks)?;
            while walk.entries.len() < last {
                let name = format!("audio tensor {}", walk.entries.len() - audio_start);
                walk.next(|r| Slot::float(name, &r.shape()))?;
            }
        }
        let t = walk.next(|_| Slot::raw("tokenizer"))?;
        let entries = walk.entries;
        check_overlaps(&entries)?;

        let blob = &entries[t];
        let tokenizer = TokenizerSpec::parse_at(blob.blob(file), blob.blob_offset)?;
        // Rows past the tokenizer's pieces are input-only code embeddings (upstream
        // `_pack_cact` refuses only a tokenizer larger than the vocabulary).
        if tokenizer.pieces.len() as u64 > u64::from(common.vocab) {
            return Err(CactError::TokenizerVocab {
                offset: blob.blob_offset,
                found: tokenizer.pieces.len() as u32,
                vocab: common.vocab,
            });
        }
        Ok(Needle3File {
            audio_tensors: t - audio_start,
            header,
            heads,
            tokenizer,
            tensors: Tensors::new(entries, codebooks, bytes),
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Needle3Header {
        &self.header
    }

    /// The 2/3/4-bit codebooks stored after the header.
    pub fn codebooks(&self) -> &Codebooks {
        self.tensors.codebooks()
    }

    /// Every tensor in file order, named as upstream names it (audio tensors by position).
    pub fn entries(&self) -> &[Entry] {
        self.tensors.entries()
    }

    /// The probe heads listed in `heads.manifest`, in file order (empty when none).
    pub fn head_kinds(&self) -> &[HeadKind] {
        &self.heads
    }

    /// Tensors of the Whistle audio section, which is checked and skipped (0 when none).
    pub fn audio_tensors(&self) -> usize {
        self.audio_tensors
    }

    /// The tokenizer carried in the RAW `tokenizer` blob.
    pub fn tokenizer(&self) -> &TokenizerSpec {
        &self.tokenizer
    }

    /// The float32 values of the tensor with upstream name `name`, CQ tensors
    /// dequantized exactly like upstream `read_export`.
    pub fn tensor(&self, name: &str) -> Result<Tensor, CactError> {
        self.tensors.tensor(name)
    }

    /// The codes and norms of CQ tensor `name` as stored (`None` when it is not CQ).
    pub fn cq_rows(&self, name: &str) -> Result<Option<CqRows>, CactError> {
        self.tensors.cq_rows(name)
    }
}

impl std::fmt::Debug for Needle3File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Needle3File")
            .field("header", &self.header)
            .field("tensors", &self.entries().len())
            .field("heads", &self.heads)
            .field("audio_tensors", &self.audio_tensors)
            .field("bytes", &self.tensors.file_len())
            .finish_non_exhaustive()
    }
}

/// Whether a record looks like the Whistle manifest (13 FP32 values); the values are
/// checked once the record is.
fn is_audio_manifest(r: &Record) -> bool {
    r.dtype == 2 && r.ndim == 1 && r.dims[0] == AUDIO_MANIFEST_LEN
}

fn check_audio_manifest(
    entry: &Entry,
    file: &[u8],
    codebooks: &Codebooks,
) -> Result<(), CactError> {
    let values = cq::decode(entry, entry.blob(file), codebooks)?;
    let magic = values.first().copied();
    if entry.encoding != Encoding::Fp32
        || entry.shape != [AUDIO_MANIFEST_LEN as usize]
        || magic != Some(AUDIO_MAGIC)
    {
        return Err(CactError::AudioManifest {
            offset: entry.record_offset,
            found: format!(
                "{:?} {:?} starting with {magic:?}",
                entry.encoding, entry.shape
            ),
        });
    }
    Ok(())
}

/// `heads.manifest` and the heads it lists: per head probes, gain, query, row_bias,
/// proj, bias (+ the router's calibration), `rows = num_layers + 1`.
fn read_heads(
    walk: &mut DirectoryWalk<'_>,
    file: &[u8],
    codebooks: &Codebooks,
    header: &Needle3Header,
) -> Result<Vec<HeadKind>, CactError> {
    let i = walk.next(|r| Slot::float("heads.manifest", &[r.dims[0].into()]))?;
    let manifest = &walk.entries[i];
    let count = manifest.shape[0] as u64;
    if !(1..=HeadKind::ALL.len() as u64).contains(&count) {
        return Err(CactError::HeadCount {
            offset: manifest.record_offset,
            found: count,
            most: HeadKind::ALL.len() as u64,
        });
    }
    let codes = cq::decode(manifest, manifest.blob(file), codebooks)?;
    let width = if manifest.encoding == Encoding::Fp32 {
        4
    } else {
        2
    };
    let mut heads: Vec<HeadKind> = Vec::new();
    for (index, &code) in codes.iter().enumerate() {
        let kind = HeadKind::ALL.into_iter().find(|k| k.code() as f32 == code);
        match kind {
            // Canonical order: each code above the one before.
            Some(kind) if heads.last().is_none_or(|last| last.code() < kind.code()) => {
                heads.push(kind)
            }
            _ => {
                return Err(CactError::HeadCode {
                    offset: manifest.blob_offset + width * index as u64,
                    index,
                    found: code,
                    expected:
                        "ascending distinct head codes 1 (embedding), 2 (confidence) or 3 (router)",
                })
            }
        }
    }
    let (rows, d) = (
        u64::from(header.common.num_layers) + 1,
        u64::from(header.common.d_model),
    );
    for &kind in &heads {
        let name = kind.name();
        // CQ heads store the probes as `[rows * k, d]`; the earlier FP16 layout as `[rows, k, d]`.
        let p = walk.next(|r| {
            let name = format!("{name}.probes");
            if r.ndim == 3 {
                Slot::float(name, &[rows, r.dims[1].into(), d])
            } else {
                let k = (u64::from(r.dims[0]) / rows).max(1);
                Slot::float(name, &[rows * k, d])
            }
        })?;
        let probes = &walk.entries[p].shape;
        let k = if probes.len() == 3 {
            probes[1] as u64
        } else {
            probes[0] as u64 / rows
        };
        walk.next(|_| Slot::float(format!("{name}.gain"), &[rows, k]))?;
        let q =
            walk.next(|r| Slot::float(format!("{name}.query"), &[r.dims[0].max(1).into(), d]))?;
        let q = walk.entries[q].shape[0] as u64;
        walk.next(|_| Slot::float(format!("{name}.row_bias"), &[q, rows, k]))?;
        let j = walk.next(|r| {
            let out = kind
                .fixed_outputs()
                .map_or(r.dims[0].max(1).into(), |n| n as u64);
            Slot::float(format!("{name}.proj"), &[out, q * d])
        })?;
        let out = walk.entries[j].shape[0] as u64;
        walk.next(|_| Slot::float(format!("{name}.bias"), &[out]))?;
        if kind == HeadKind::Router {
            walk.next(|_| Slot::float(format!("{name}.calibration"), &[3]))?;
        }
    }
    Ok(heads)
}
