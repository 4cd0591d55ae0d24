//! The 28 Lloyd-Max codebook entries after the header (both generations store the same
//! three), and the ternary and binary codebooks the file does not store.

use super::bytes::Reader;
use super::layout::CODEBOOK_LEN;
use super::CactError;

/// The Lloyd-Max codebooks stored after the header, already divided by
/// `sqrt(group)` by the writer. Each is finite and ascending.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebooks {
    pub cb2: [f32; 4],
    pub cb3: [f32; 8],
    pub cb4: [f32; 16],
}

impl Codebooks {
    /// The codebook for a 2-, 3- or 4-bit CQ record.
    pub fn for_bits(&self, bits: u32) -> Option<&[f32]> {
        match bits {
            2 => Some(&self.cb2),
            3 => Some(&self.cb3),
            4 => Some(&self.cb4),
            _ => None,
        }
    }

    /// The ternary (record bits 5) codebook, which the file does not store:
    /// `{-c, 0, c} / sqrt(group)` with `c = 1.2240064`, computed in f64 and
    /// rounded to f32 like upstream `_cq_codebook_np(1.58, group)`.
    pub fn ternary(group: u32) -> [f32; 3] {
        let c = (TERNARY_C / (group as f64).sqrt()) as f32;
        [-c, 0.0, c]
    }

    /// The binary (record bits 1, Needle 3) codebook, which the file does not store:
    /// `{-c, c} / sqrt(group)` with `c = sqrt(2/pi)`, the centroids of a Gaussian's two
    /// halves, computed in f64 and rounded to f32 like upstream `_cq_codebook_np(1, group)`.
    pub fn binary(group: u32) -> [f32; 2] {
        let c = ((2.0 / std::f64::consts::PI).sqrt() / (group as f64).sqrt()) as f32;
        [-c, c]
    }
}

/// Lloyd-Max centroid of the 3-level Gaussian quantizer (upstream `_TERNARY_CB`).
const TERNARY_C: f64 = 1.224_006_4;

/// Reads the three codebooks at `r`: each entry finite, each codebook ascending.
pub(crate) fn read_codebooks(r: &mut Reader<'_>) -> Result<Codebooks, CactError> {
    let start = r.offset();
    let bytes = r.take(CODEBOOK_LEN as usize * 4, || "codebook".to_string())?;
    let mut values = [0f32; CODEBOOK_LEN as usize];
    for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    let mut first = 0;
    for len in [4, 8, 16] {
        let cb = &values[first..first + len];
        for i in 0..len {
            let ascending = i == 0 || cb[i - 1] < cb[i];
            if !cb[i].is_finite() || !ascending {
                return Err(CactError::Codebook {
                    index: first + i,
                    offset: start + 4 * (first + i) as u64,
                    found: cb[i],
                });
            }
        }
        first += len;
    }
    let mut cb2 = [0f32; 4];
    let mut cb3 = [0f32; 8];
    let mut cb4 = [0f32; 16];
    cb2.copy_from_slice(&values[..4]);
    cb3.copy_from_slice(&values[4..12]);
    cb4.copy_from_slice(&values[12..]);
    Ok(Codebooks { cb2, cb3, cb4 })
}
