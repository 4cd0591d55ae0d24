//! Opt-in compact MatMuls: `com.microsoft.MatMulNBits` with symmetric per-block
//! quantization of the dequantized `.cact` weights (blocks of 32 along the input
//! axis, scale `absmax / (2^(bits-1) − 1)`, implicit zero point `2^(bits-1)`).
//! This re-quantizes, so it is not the exact model; the README states its cost.

use crate::builder::{Attr, GraphBuilder, MatMulWeights, Value, MS_DOMAIN};
use crate::onnx::data_type;

const BLOCK: usize = 32;

/// `x @ W^T` with `W` `[n, k]` row-major, as one MatMulNBits node.
pub fn matmul_nbits(b: &mut GraphBuilder, x: &Value, w: &[f32], n: usize, k: usize) -> Value {
    let bits = match b.matmul_weights() {
        MatMulWeights::Int8 => 8,
        MatMulWeights::Int4 => 4,
        MatMulWeights::Float => unreachable!("matmul_nbits is only emitted for quantized weights"),
    };
    let blocks = k.div_ceil(BLOCK);
    let blob = BLOCK * bits / 8;
    let qmax = ((1 << (bits - 1)) - 1) as f32;
    let zero = 1u32 << (bits - 1);
    let mut packed = vec![0u8; n * blocks * blob];
    let mut scales = Vec::with_capacity(n * blocks);
    for row in 0..n {
        for blk in 0..blocks {
            let start = blk * BLOCK;
            let vals = &w[row * k + start..row * k + k.min(start + BLOCK)];
            let scale = best_scale(vals, qmax);
            scales.push(scale);
            let out = &mut packed[(row * blocks + blk) * blob..][..blob];
            for (i, v) in vals.iter().enumerate() {
                let q = (quantize(*v, scale, qmax) as i32 + zero as i32) as u8;
                match bits {
                    8 => out[i] = q,
                    _ => out[i / 2] |= q << (4 * (i % 2)),
                }
            }
            if bits == 4 {
                for i in vals.len()..BLOCK {
                    out[i / 2] |= (zero as u8) << (4 * (i % 2));
                }
            } else {
                out[vals.len()..].fill(zero as u8);
            }
        }
    }
    let weight = b.weight_bytes("qweight", data_type::UINT8, &[n, blocks, blob], packed);
    let scales = b.weight("scales", &[n, blocks], &scales);
    b.op_in(
        MS_DOMAIN,
        "MatMulNBits",
        &[x, &weight, &scales],
        vec![
            ("K", Attr::Int(k as i64)),
            ("N", Attr::Int(n as i64)),
            ("bits", Attr::Int(bits as i64)),
            ("block_size", Attr::Int(BLOCK as i64)),
            ("accuracy_level", Attr::Int(4)),
        ],
        1,
    )
    .remove(0)
}

fn quantize(v: f32, scale: f32, qmax: f32) -> f32 {
    (v / scale).round().clamp(-qmax - 1.0, qmax)
}

/// The block scale with the least squared error among `absmax / qmax` shrunk by
/// 0–30% (clipping a few outliers often lowers the error of the rest).
fn best_scale(vals: &[f32], qmax: f32) -> f32 {
    let absmax = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if absmax == 0.0 {
        return 1.0;
    }
    let error = |scale: f32| -> f32 {
        vals.iter()
            .map(|v| (quantize(*v, scale, qmax) * scale - v).powi(2))
            .sum()
    };
    (0..=30)
        .map(|step| absmax / qmax * (1.0 - step as f32 / 100.0))
        .min_by(|a, b| error(*a).total_cmp(&error(*b)))
        .expect("a non-empty range")
}
