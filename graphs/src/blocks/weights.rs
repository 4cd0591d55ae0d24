//! The weight types both generations share, dequantized float32 in the `.cact` layout
//! (matrices pre-transposed to `[out, in]`): tensors, CQ codes, the hyper-connection and
//! engram tensors.

use crate::blocks::hadamard::walsh_hadamard;
use std::sync::Arc;

/// A dense float32 tensor, row-major, with the CQ codes it was dequantized from.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// The `.cact`'s codes of a CQ matrix, exactly what `data` decodes (`None` for FP16/FP32
    /// tensors and for tensors cut or combined in Rust): `cq` weight storage writes these
    /// into the graph instead of `data`.
    pub codes: Option<Arc<CqRows>>,
}

impl Tensor {
    /// A tensor with no codes behind it.
    pub fn dense(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor {
            shape,
            data,
            codes: None,
        }
    }
}

/// The 9 hyper-connection tensors (`mhc_*`), stacked over layers.
#[derive(Clone, Debug)]
pub struct MhcWeights {
    /// `[num_layers]`.
    pub a_pre: Tensor,
    pub a_post: Tensor,
    pub a_res: Tensor,
    /// `[num_layers, lanes]`.
    pub b_pre: Tensor,
    pub b_post: Tensor,
    /// `[num_layers, lanes, lanes]`.
    pub b_res: Tensor,
    /// `[num_layers * lanes, lanes * d_model]`: layer `l` is rows `l*lanes..`, transposed.
    pub phi_pre: Tensor,
    pub phi_post: Tensor,
    /// `[num_layers * lanes * lanes, lanes * d_model]`.
    pub phi_res: Tensor,
}

/// An engram site's tables `[num_tables * slots, sub_dim]`: dequantized, or kept as the
/// `.cact`'s CQ codes and decoded in the graph row by row as rows are gathered.
#[derive(Clone, Debug, PartialEq)]
pub enum EngramTables {
    Dense(Tensor),
    Codes(CqRows),
}

/// A CQ matrix as the `.cact` stores it (upstream `export._cq_unpack`): per row,
/// `cols` rounded up to groups of `group`, each group `(codebook[index] · norm) @ H`.
#[derive(Clone, Debug, PartialEq)]
pub struct CqRows {
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    /// Bits per stored index (2 for ternary crumbs).
    pub index_bits: usize,
    /// `rows` rows of `cols_padded · index_bits / 8` bytes, each an LSB-first bitstream.
    pub codes: Vec<u8>,
    /// `rows × groups` IEEE half bit patterns.
    pub norms: Vec<u16>,
    /// The value of each stored index (`2^index_bits` entries; ternary crumbs map to
    /// `{0, +c, unused, −c}`).
    pub codebook: Vec<f32>,
}

impl CqRows {
    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.cols.div_ceil(self.group)
    }

    /// Bytes per row of codes.
    pub fn row_bytes(&self) -> usize {
        self.groups() * self.group * self.index_bits / 8
    }

    /// The stored index of input `k` (of the padded `groups · group`) of row `r`.
    pub fn index(&self, r: usize, k: usize) -> usize {
        let row = &self.codes[r * self.row_bytes()..(r + 1) * self.row_bytes()];
        let bit = k * self.index_bits;
        let low = row[bit / 8] as usize;
        let high = row.get(bit / 8 + 1).copied().unwrap_or(0) as usize;
        ((low | (high << 8)) >> (bit % 8)) & ((1 << self.index_bits) - 1)
    }

    /// Its rows `rows` (a range within `0..self.rows`).
    pub fn row_range(&self, rows: std::ops::Range<usize>) -> CqRows {
        CqRows {
            rows: rows.len(),
            codes: self.codes[rows.start * self.row_bytes()..rows.end * self.row_bytes()].to_vec(),
            norms: self.norms[rows.start * self.groups()..rows.end * self.groups()].to_vec(),
            ..self.clone()
        }
    }

    /// `parts` stacked along their rows (one matrix of `Σ rows_i` outputs), `None` unless
    /// they share the input width, the group, the width of the codes and the codebook.
    pub fn stacked(parts: &[&CqRows]) -> Option<CqRows> {
        let first = parts.first()?;
        fn layout(p: &CqRows) -> (usize, usize, usize, &[f32]) {
            (p.cols, p.group, p.index_bits, &p.codebook)
        }
        if parts.iter().any(|p| layout(p) != layout(first)) {
            return None;
        }
        Some(CqRows {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            group: first.group,
            index_bits: first.index_bits,
            codes: parts.iter().flat_map(|p| p.codes.iter().copied()).collect(),
            norms: parts.iter().flat_map(|p| p.norms.iter().copied()).collect(),
            codebook: first.codebook.clone(),
        })
    }

    /// The fp16 norm of group `g` of row `r`.
    pub fn norm(&self, r: usize, g: usize) -> u16 {
        self.norms[r * self.groups() + g]
    }

    /// Every row decoded, `[rows, cols]` row-major: per group
    /// `(codebook[index] · norm) @ H`, the padding cut off.
    pub fn decoded(&self) -> Vec<f32> {
        let h = walsh_hadamard(self.group);
        let mut out = Vec::with_capacity(self.rows * self.cols);
        let mut row = vec![0.0f32; self.groups() * self.group];
        for r in 0..self.rows {
            for g in 0..self.groups() {
                let norm = kernels::f16::to_f32(self.norm(r, g));
                let scaled: Vec<f32> = (0..self.group)
                    .map(|k| self.codebook[self.index(r, g * self.group + k)] * norm)
                    .collect();
                for j in 0..self.group {
                    row[g * self.group + j] = (0..self.group)
                        .map(|k| scaled[k] * h[k * self.group + j])
                        .sum();
                }
            }
            out.extend_from_slice(&row[..self.cols]);
        }
        out
    }
}

/// One engram site (`engramS.*`).
#[derive(Clone, Debug)]
pub struct EngramWeights {
    /// `[num_tables * slots, sub_dim]`.
    pub tables: EngramTables,
    /// `[d_model, num_tables * sub_dim]`.
    pub key_proj: Tensor,
    pub value_proj: Tensor,
    /// `[conv_taps, d_model]`.
    pub taps: Tensor,
}
