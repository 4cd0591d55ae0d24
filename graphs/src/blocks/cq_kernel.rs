//! MatMul kernels `[in, out]` of CQ matrices (`cq` weight storage), built in the graph
//! from the `.cact`'s codes by nodes that read initializers only, so onnxruntime's
//! constant folding turns each into one float initializer at session creation: the file
//! keeps the 1–4-bit codes, the running session has the float export's kernel.
//!
//! The codes are laid out here, in Rust, in the kernel's orientation, so the graph needs
//! no Transpose or Concat (every folded node costs session creation a pass over the
//! kernel): per input group `g` and in-group input `k`, the code of every output column,
//! packed LSB-first along the outputs. 3-bit codes are widened to 4 bits so that each byte
//! holds whole codes.
//!
//! ```text
//! codes [G, group, out bytes] ─Cast─Gather(values of each byte's codes)─ [G, group, out] ─┐
//! norms [G, 1, out] ─Cast────────────────────────────────────────────────────────────────── · ─ H @ ─ [G·group, out] ─ [in, out]
//! ```
//! (`H` is symmetric, so `H @ codes` per group is the reader's `codes @ H` per row, and
//! [`rotate`] sums it in the reader's order: the kernel is the float export's bit for bit.)

use crate::blocks::cq_rows::{byte_values, rotate, RotatedAxis};
use crate::blocks::weights::CqRows;
use crate::builder::{GraphBuilder, Value};
use crate::contract::Precision;
use crate::onnx::data_type;

/// CQ matrices stacked along their outputs, as codes in the kernel's orientation.
pub struct CqKernel {
    inputs: usize,
    outputs: usize,
    group: usize,
    groups: usize,
    index_bits: usize,
    /// `[groups, group, padded outputs · index_bits / 8]`.
    codes: Vec<u8>,
    /// `[groups, padded outputs]` fp16 bit patterns (zero for the padding).
    norms: Vec<u16>,
    /// `2^index_bits` values.
    codebook: Vec<f32>,
}

impl CqKernel {
    /// The kernel of `parts` (each `[out_i, in]`) stacked along the outputs; `None` unless
    /// they share the input width, the group and the codebook.
    pub fn of(parts: &[&CqRows]) -> Option<CqKernel> {
        let stacked = CqRows::stacked(parts)?;
        let index_bits = if stacked.index_bits == 3 {
            4
        } else {
            stacked.index_bits
        };
        let mut codebook = stacked.codebook.clone();
        codebook.resize(1 << index_bits, 0.0);
        let per_byte = 8 / index_bits;
        let (group, groups) = (stacked.group, stacked.groups());
        let outputs = stacked.rows;
        let padded = outputs.div_ceil(per_byte) * per_byte;
        let out_bytes = padded / per_byte;
        let mut codes = vec![0u8; groups * group * out_bytes];
        let mut norms = vec![0u16; groups * padded];
        for j in 0..outputs {
            let (byte, shift) = (j / per_byte, (j % per_byte) * index_bits);
            for g in 0..groups {
                norms[g * padded + j] = stacked.norm(j, g);
                for k in 0..group {
                    let index = stacked.index(j, g * group + k);
                    codes[(g * group + k) * out_bytes + byte] |= (index << shift) as u8;
                }
            }
        }
        Some(CqKernel {
            inputs: stacked.cols,
            outputs,
            group,
            groups,
            index_bits,
            codes,
            norms,
            codebook,
        })
    }

    fn padded_outputs(&self) -> usize {
        self.norms.len() / self.groups
    }
}

/// The float kernel `[in, out]` in the graph's precision, decoded in float32 like the
/// `.cact` reader decodes it. Initializers `<scope>.<name>.codes` / `.norms` /
/// `.byte_values`.
pub fn cq_kernel(b: &mut GraphBuilder, name: &str, kernel: &CqKernel) -> Value {
    b.scope(name, |b| {
        let (group, groups) = (kernel.group, kernel.groups);
        let padded = kernel.padded_outputs();
        let per_byte = 8 / kernel.index_bits;
        let codes = b.weight_bytes(
            "codes",
            data_type::UINT8,
            &[groups, group, padded / per_byte],
            kernel.codes.clone(),
        );
        let norms_raw = kernel.norms.iter().flat_map(|n| n.to_le_bytes()).collect();
        let norms = b.weight_bytes("norms", data_type::FLOAT16, &[groups, 1, padded], norms_raw);
        let values = Precision::Fp32.encode(&byte_values(&kernel.codebook, kernel.index_bits));
        let values = b.weight_bytes("byte_values", data_type::FLOAT, &[256, per_byte], values);

        let index = b.cast(&codes, data_type::INT32);
        let decoded = b.gather(&values, &index, 0);
        let decoded = b.reshape(&decoded, &[groups as i64, group as i64, padded as i64]);
        let norms = b.cast(&norms, data_type::FLOAT);
        let scaled = b.mul(&decoded, &norms);
        let rotated = rotate(
            b,
            &scaled,
            group,
            groups == 1,
            RotatedAxis::Columns,
            data_type::FLOAT,
        );
        let w = b.reshape(&rotated, &[(groups * group) as i64, padded as i64]);
        let w = match groups * group > kernel.inputs {
            true => b.slice(&w, 0, 0, kernel.inputs as i64),
            false => w,
        };
        let w = match padded > kernel.outputs {
            true => b.slice(&w, 1, 0, kernel.outputs as i64),
            false => w,
        };
        match b.precision() {
            Precision::Fp32 => w,
            Precision::Fp16 => b.cast(&w, data_type::FLOAT16),
        }
    })
}
