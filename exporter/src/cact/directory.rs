//! The nameless directory: records laid out as
//! [`RECORD_FIELDS`](super::layout::RECORD_FIELDS) declares (dtype, ndim, pad,
//! `dims[4]`, blob offset, nbytes, group, bits), checked one by one against the
//! slot the positional order assigns them.

use super::bytes::Reader;
use super::layout::{record_element_offset, RecordField, ALIGN, RECORD_BYTES};
use super::CactError;

/// Record `bits` value of a ternary (1.58-bit) CQ tensor.
pub const TERNARY_BITS: u32 = 5;
/// Record `bits` value of a binary CQ tensor (Needle 3 only).
pub const BINARY_BITS: u32 = 1;

/// The CQ record widths a generation stores, and how an error lists them.
#[derive(Clone, Copy, Debug)]
pub struct CqWidths {
    pub bits: &'static [u32],
    pub text: &'static str,
}

/// Needle 2: 2, 3, 4 bits and ternary.
pub const NEEDLE2_CQ: CqWidths = CqWidths {
    bits: &[2, 3, 4, TERNARY_BITS],
    text: "2, 3, 4 or 5 (ternary)",
};

/// Needle 3 adds binary.
pub const NEEDLE3_CQ: CqWidths = CqWidths {
    bits: &[BINARY_BITS, 2, 3, 4, TERNARY_BITS],
    text: "1 (binary), 2, 3, 4 or 5 (ternary)",
};
/// Largest CQ group size accepted (upstream writes 128; the Hadamard matrix is `group^2`).
pub const MAX_GROUP: u32 = 1024;

/// How a tensor's blob is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// dtype 1: little-endian IEEE half floats.
    Fp16,
    /// dtype 2: little-endian IEEE floats.
    Fp32,
    /// dtype 3: Cactus-Quants; `bits` is 1 (binary), 2, 3, 4 or 5 (= ternary crumbs).
    Cq { bits: u32, group: u32 },
    /// dtype 4: opaque bytes (the tokenizer).
    Raw,
}

/// One validated directory entry, named as upstream names it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Upstream name, e.g. `layer03.k_proj`.
    pub name: String,
    /// File offset of the 44-byte directory record.
    pub record_offset: u64,
    pub encoding: Encoding,
    /// Logical shape (`[out, in]` for matrices, unpadded); empty for RAW.
    pub shape: Vec<usize>,
    /// File offset of the blob (64-byte aligned).
    pub blob_offset: u64,
    pub nbytes: u64,
}

impl Entry {
    /// The entry's blob; the range was checked against the file when parsing.
    pub(crate) fn blob<'a>(&self, file: &'a [u8]) -> &'a [u8] {
        &file[self.blob_offset as usize..(self.blob_offset + self.nbytes) as usize]
    }
}

/// What the positional order expects at one index.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub name: String,
    pub shape: Vec<u64>,
    pub raw: bool,
}

impl Slot {
    pub(crate) fn float(name: impl Into<String>, shape: &[u64]) -> Self {
        Slot {
            name: name.into(),
            shape: shape.to_vec(),
            raw: false,
        }
    }

    pub(crate) fn raw(name: impl Into<String>) -> Self {
        Slot {
            name: name.into(),
            shape: Vec::new(),
            raw: true,
        }
    }
}

/// A directory record as stored, before it is matched to a slot.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub offset: u64,
    pub dtype: u8,
    pub ndim: u8,
    pub dims: [u32; 4],
    pub blob_offset: u64,
    pub nbytes: u64,
    pub group: u32,
    pub bits: u32,
}

impl Record {
    /// Reads record `index` of the directory starting at `dir_start`.
    pub(crate) fn read(file: &[u8], dir_start: u64, index: u64) -> Result<Record, CactError> {
        let offset = dir_start + index * RECORD_BYTES;
        let rest = usize::try_from(offset)
            .ok()
            .and_then(|o| file.get(o..))
            .unwrap_or_default();
        let mut r = Reader::new(rest, offset);
        let record = r.take(RECORD_BYTES as usize, || {
            format!("directory record {index}")
        })?;
        let at = |field, element| record_element_offset(field, element) as usize;
        let u32_at = |field, element| {
            let o = at(field, element);
            u32::from_le_bytes(std::array::from_fn(|k| record[o + k]))
        };
        let u64_at = |field| {
            let o = at(field, 0);
            u64::from_le_bytes(std::array::from_fn(|k| record[o + k]))
        };
        Ok(Record {
            offset,
            dtype: record[at(RecordField::Dtype, 0)],
            ndim: record[at(RecordField::Ndim, 0)],
            dims: std::array::from_fn(|i| u32_at(RecordField::Dims, i)),
            blob_offset: u64_at(RecordField::BlobOffset),
            nbytes: u64_at(RecordField::NBytes),
            group: u32_at(RecordField::Group, 0),
            bits: u32_at(RecordField::Bits, 0),
        })
    }

    /// The first `ndim` dims; only meaningful once `ndim <= 4` is checked.
    pub(crate) fn shape(&self) -> Vec<u64> {
        self.dims[..(self.ndim as usize).min(4)]
            .iter()
            .map(|&d| d as u64)
            .collect()
    }

    /// Checks this record against `slot` and the file; `data_start` is the
    /// first byte after the directory, `widths` the CQ widths of the file's generation.
    pub(crate) fn check(
        &self,
        slot: &Slot,
        file_len: u64,
        data_start: u64,
        widths: CqWidths,
    ) -> Result<Entry, CactError> {
        let tensor = || slot.name.clone();
        let encoding = self.encoding(slot, widths)?;
        if self.ndim as usize != slot.shape.len() {
            return Err(CactError::Ndim {
                tensor: tensor(),
                offset: self.offset,
                found: self.ndim,
                expected: slot.shape.len(),
            });
        }
        let shape = self.shape();
        if shape != slot.shape {
            return Err(CactError::Shape {
                tensor: tensor(),
                offset: self.offset,
                found: shape,
                expected: slot.shape.clone(),
            });
        }
        if let Some(expected) = expected_nbytes(encoding, &shape) {
            if expected != self.nbytes {
                return Err(CactError::NBytes {
                    tensor: tensor(),
                    offset: self.offset,
                    found: self.nbytes,
                    expected,
                });
            }
        }
        let end = self.blob_offset.checked_add(self.nbytes);
        if end.is_none_or(|end| end > file_len) {
            return Err(CactError::BlobOutOfBounds {
                tensor: tensor(),
                offset: self.offset,
                start: self.blob_offset,
                nbytes: self.nbytes,
                file_len,
            });
        }
        if !self.blob_offset.is_multiple_of(ALIGN) {
            return Err(CactError::Misaligned {
                tensor: tensor(),
                offset: self.offset,
                start: self.blob_offset,
            });
        }
        if self.nbytes > 0 && self.blob_offset < data_start {
            return Err(CactError::Overlap {
                tensor: tensor(),
                offset: self.offset,
                start: self.blob_offset,
                other: "the header and directory".to_string(),
            });
        }
        Ok(Entry {
            name: slot.name.clone(),
            record_offset: self.offset,
            encoding,
            shape: shape.iter().map(|&d| d as usize).collect(),
            blob_offset: self.blob_offset,
            nbytes: self.nbytes,
        })
    }

    fn encoding(&self, slot: &Slot, widths: CqWidths) -> Result<Encoding, CactError> {
        let expected = match (slot.raw, slot.shape.len()) {
            (true, _) => "4 (RAW)",
            (false, 2) => "1 (FP16), 2 (FP32) or 3 (CQ)",
            (false, _) => "1 (FP16) or 2 (FP32)",
        };
        let encoding = match (self.dtype, slot.raw, slot.shape.len()) {
            (4, true, _) => Encoding::Raw,
            (1, false, _) => Encoding::Fp16,
            (2, false, _) => Encoding::Fp32,
            (3, false, 2) => Encoding::Cq {
                bits: self.bits,
                group: self.group,
            },
            (found, ..) => {
                return Err(CactError::Dtype {
                    tensor: slot.name.clone(),
                    offset: self.offset,
                    found,
                    expected,
                })
            }
        };
        if let Encoding::Cq { bits, group } = encoding {
            if !widths.bits.contains(&bits) {
                return Err(CactError::Bits {
                    tensor: slot.name.clone(),
                    offset: self.offset,
                    found: bits,
                    expected: widths.text,
                });
            }
            if !(group.is_power_of_two() && (8..=MAX_GROUP).contains(&group)) {
                return Err(CactError::Group {
                    tensor: slot.name.clone(),
                    offset: self.offset,
                    found: group,
                });
            }
        }
        Ok(encoding)
    }
}

/// Bytes a blob of this encoding and shape must have; `None` for RAW (any
/// length) and when the size does not fit in 64 bits (no file can hold it,
/// so the bounds check rejects it).
fn expected_nbytes(encoding: Encoding, shape: &[u64]) -> Option<u64> {
    let elements = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    match encoding {
        Encoding::Raw => None,
        Encoding::Fp16 => elements?.checked_mul(2),
        Encoding::Fp32 => elements?.checked_mul(4),
        Encoding::Cq { bits, group } => {
            let (out, in_pad) = (shape[0], padded_in(shape[1], group)?);
            let packed = out
                .checked_mul(in_pad)?
                .checked_mul(index_bits(bits) as u64)?
                / 8;
            let norms = out.checked_mul(in_pad / group as u64)?.checked_mul(2)?;
            packed.checked_add(norms)
        }
    }
}

/// `in_dim` rounded up to a multiple of `group`.
pub(crate) fn padded_in(in_dim: u64, group: u32) -> Option<u64> {
    let group = group as u64;
    in_dim.checked_add(group - 1).map(|v| v / group * group)
}

/// Bits per stored index: ternary crumbs take 2.
pub(crate) fn index_bits(record_bits: u32) -> u32 {
    if record_bits == TERNARY_BITS {
        2
    } else {
        record_bits
    }
}

/// Checks that no two non-empty blobs share a byte.
pub(crate) fn check_overlaps(entries: &[Entry]) -> Result<(), CactError> {
    let mut order: Vec<&Entry> = entries.iter().filter(|e| e.nbytes > 0).collect();
    order.sort_by_key(|e| e.blob_offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.blob_offset < a.blob_offset + a.nbytes {
            return Err(CactError::Overlap {
                tensor: b.name.clone(),
                offset: b.record_offset,
                start: b.blob_offset,
                other: format!("the blob of {} at byte {}", a.name, a.blob_offset),
            });
        }
    }
    Ok(())
}

/// Reads a directory record by record, checking each against the slot the caller's
/// walk assigns it.
pub(crate) struct DirectoryWalk<'f> {
    file: &'f [u8],
    dir_start: u64,
    data_start: u64,
    widths: CqWidths,
    pub entries: Vec<Entry>,
}

impl<'f> DirectoryWalk<'f> {
    /// A walk over `num_tensors` records from `dir_start`; the caller has checked that
    /// the directory fits in `file`, which bounds the allocation.
    pub(crate) fn new(file: &'f [u8], dir_start: u64, num_tensors: u64, widths: CqWidths) -> Self {
        DirectoryWalk {
            file,
            dir_start,
            data_start: dir_start + num_tensors * RECORD_BYTES,
            widths,
            entries: Vec::with_capacity(num_tensors as usize),
        }
    }

    /// The next record, not yet checked.
    pub(crate) fn peek(&self) -> Result<Record, CactError> {
        Record::read(self.file, self.dir_start, self.entries.len() as u64)
    }

    /// Checks the next record against the slot `slot` makes of it; returns its index.
    pub(crate) fn next(&mut self, slot: impl FnOnce(&Record) -> Slot) -> Result<usize, CactError> {
        let record = self.peek()?;
        let entry = record.check(
            &slot(&record),
            self.file.len() as u64,
            self.data_start,
            self.widths,
        )?;
        self.entries.push(entry);
        Ok(self.entries.len() - 1)
    }
}
