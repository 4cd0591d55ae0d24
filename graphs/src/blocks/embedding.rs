//! The tied embedding at both ends of the stream: `Gather(embedding)·√d` into the lanes,
//! and the output head over its first rows, in the variant's weight storage.

use crate::blocks::block_quant::{gather_table, matmul_nbits};
use crate::blocks::context::{BuildContext, OpForms};
use crate::blocks::cq_kernel::{cq_kernel, CqKernel};
use crate::blocks::cq_matmul::{cq_matmul, cq_matmul_stored};
use crate::blocks::cq_rows::{codes_and_norms, cq_gather_stored};
use crate::blocks::norms::zc_rms_norm;
use crate::blocks::weights::Tensor;
use crate::builder::{Dim, GraphBuilder, Value};
use crate::contract::dims::{BATCH, SEQUENCE};
use crate::contract::names::LOGITS_TO_KEEP;
use crate::contract::{MatMulWeights, Precision};
use crate::onnx::data_type;

/// What of the embedding table the tied output head can read instead of a copy of its own.
pub enum TiedTable {
    /// The float table.
    Float(Value),
    /// The packed table's codes and norms ([`codes_and_norms`]), read by `needle.CqMatMul`.
    Codes([Value; 2]),
    /// Nothing: the head keeps its own layout (block-quantized, or a folded CQ kernel).
    Separate,
}

/// `Gather(embedding)·√d` broadcast to the `[batch, sequence, lanes, d_model]` stream,
/// and what of the table the lm_head can share.
pub fn embed_tokens<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    embedding: &Tensor,
    input_ids: &Value,
) -> (TiedTable, Value) {
    // Compact weights keep the table as its codes (rows decoded as gathered) or
    // block-quantized; packed graphs multiply the head by the same codes, the others fold
    // or quantize a head of their own.
    let storage = ctx.matmul_weights();
    let tied = match (storage, &embedding.codes) {
        (MatMulWeights::Float, _) | (MatMulWeights::Cq | MatMulWeights::Packed, None) => {
            TiedTable::Float(b.weight("embedding", &embedding.shape, &embedding.data))
        }
        (MatMulWeights::Packed, Some(codes)) => {
            TiedTable::Codes(b.scope("embedding", |b| codes_and_norms(b, codes)))
        }
        _ => TiedTable::Separate,
    };
    let x = match (&tied, &embedding.codes) {
        (TiedTable::Float(emb), _) => b.gather(emb, input_ids, 0),
        (TiedTable::Codes(stored), Some(codes)) => {
            // Codes in the graph are packed storage's: the Needle ops decode the rows.
            let x = b.scope("embedding", |b| {
                cq_gather_stored(b, input_ids, codes, stored)
            });
            declare_rows(b, ctx, &x);
            x
        }
        _ => {
            let x = gather_table(b, storage, "embedding", embedding, input_ids);
            declare_rows(b, ctx, &x);
            x
        }
    };
    let scale = b.scalar_float((ctx.common.d_model as f64).sqrt() as f32);
    let x = b.mul(&x, &scale);
    let x = b.unsqueeze(&x, &[2]);
    let lanes = ctx.common.mhc_lanes;
    let x = match ctx.kernels.op_forms {
        OpForms::Onnx => {
            let lanes = b.const_i64(&[1, 1, lanes as i64, 1]);
            b.op1("Expand", &[&x, &lanes], vec![])
        }
        // Neither CoreML nor NNAPI takes `Expand`; a product by ones broadcasts exactly.
        OpForms::MobileAccelerators => {
            let ones = b.const_float(&[1, 1, lanes, 1], &vec![1.0; lanes]);
            b.mul(&x, &ones)
        }
    };
    (tied, x)
}

/// Rows decoded from codes get their shape from a Reshape that shape inference cannot
/// follow; without a name for it, every later tensor gets fresh symbols and session
/// creation took 5 s longer (full-size Needle 3).
fn declare_rows<C>(b: &mut GraphBuilder, ctx: &BuildContext<C>, rows: &Value) {
    let dims = [
        Dim::Named(BATCH),
        Dim::Named(SEQUENCE),
        Dim::Fixed(ctx.common.d_model),
    ];
    b.declare(rows, b.precision().data_type(), &dims);
}

/// The stream's last `logits_to_keep` positions (`names::LOGITS_TO_KEEP`, an optional
/// input; all of them where it is 0): `Slice` from `−logits_to_keep`, which is 0 then and
/// which `Slice` clamps to the sequence's start where it asks for more.
fn keep_last_positions(b: &mut GraphBuilder, x: &Value) -> Value {
    let keep = b.input_with_default(
        LOGITS_TO_KEEP,
        data_type::INT64,
        &[],
        0i64.to_le_bytes().to_vec(),
    );
    let start = b.op1("Neg", &[&keep], vec![]);
    let start = b.unsqueeze(&start, &[0]);
    b.slice_from(x, 1, &start)
}

/// Mean over lanes, `final_norm`, and the output projection tied to the first `rows`
/// rows of the embedding table (read from `tied` where the table shares it); float32
/// logits.
pub fn lm_head<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    final_norm: &Tensor,
    table: &Tensor,
    tied: &TiedTable,
    rows: usize,
    x: &Value,
) -> Value {
    let d_model = ctx.common.d_model;
    let kept;
    let x = match ctx.matmul_weights() {
        MatMulWeights::Packed => {
            kept = keep_last_positions(b, x);
            &kept
        }
        _ => x,
    };
    let x = b.reduce_mean(x, &[2]);
    let x = b.squeeze(&x, &[2]);
    let x = zc_rms_norm(b, ctx, &x, "final_norm", &final_norm.data);
    let logits = match (tied, &table.codes) {
        (TiedTable::Float(embedding), _) => {
            let head = if rows < table.shape[0] {
                b.slice(embedding, 0, 0, rows as i64)
            } else {
                embedding.clone()
            };
            let et = b.transpose(&head, &[1, 0]);
            b.matmul(&x, &et)
        }
        // The head reads the table's own codes when it is all of the table; a head over fewer
        // rows keeps its own (a Slice of the table would be folded into a copy at load). Its
        // float32 codebook is `embedding.head.codebook`: the rows' lookup may be
        // `embedding.codebook` already (3-bit codes).
        (TiedTable::Codes(stored), Some(codes)) if rows == table.shape[0] => {
            b.scope("embedding.head", |b| cq_matmul_stored(b, &x, codes, stored))
        }
        _ => b.scope("embedding", |b| {
            match (ctx.matmul_weights(), &table.codes) {
                (MatMulWeights::Packed, Some(codes)) => cq_matmul(b, &x, &codes.row_range(0..rows)),
                (MatMulWeights::Cq, Some(codes)) => {
                    let head = CqKernel::of(&[&codes.row_range(0..rows)]).expect("one matrix");
                    let kernel = cq_kernel(b, "kernel", &head);
                    b.matmul(&x, &kernel)
                }
                (storage, _) => {
                    let head = &table.data[..rows * d_model];
                    matmul_nbits(b, storage, &x, head, rows, d_model)
                }
            }
        }),
    };
    match ctx.variant.precision {
        Precision::Fp32 => logits,
        Precision::Fp16 => b.cast(&logits, data_type::FLOAT),
    }
}
