//! The tied embedding at both ends of the stream: `Gather(embedding)·√d` into the lanes,
//! and the output head over its first rows, in the variant's weight storage.

use crate::blocks::block_quant::{gather_table, matmul_nbits};
use crate::blocks::context::{BuildContext, OpForms};
use crate::blocks::cq_kernel::{cq_kernel, CqKernel};
use crate::blocks::cq_matmul::cq_matmul;
use crate::blocks::norms::zc_rms_norm;
use crate::blocks::weights::Tensor;
use crate::builder::{Dim, GraphBuilder, Value};
use crate::contract::dims::{BATCH, SEQUENCE};
use crate::contract::{MatMulWeights, Precision};
use crate::onnx::data_type;

/// `Gather(embedding)·√d` broadcast to the `[batch, sequence, lanes, d_model]` stream.
/// Returns the float table too when it is one (the lm_head is tied to it).
pub fn embed_tokens<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    embedding: &Tensor,
    input_ids: &Value,
) -> (Option<Value>, Value) {
    // Compact weights keep each use of the table in its own layout: block-quantized, or
    // the codes (rows decoded as gathered, the lm_head a folded kernel).
    let storage = ctx.matmul_weights();
    let dense = match storage {
        MatMulWeights::Float => true,
        MatMulWeights::Cq | MatMulWeights::Packed => embedding.codes.is_none(),
        MatMulWeights::Int8 | MatMulWeights::Int4 => false,
    };
    let emb = dense.then(|| b.weight("embedding", &embedding.shape, &embedding.data));
    let x = match &emb {
        Some(emb) => b.gather(emb, input_ids, 0),
        None => {
            let x = gather_table(b, storage, "embedding", embedding, input_ids);
            // Rows decoded from codes get their shape from a Reshape that shape inference
            // cannot follow; without a name for it, every later tensor gets fresh symbols
            // and session creation took 5 s longer (full-size Needle 3).
            let dims = [
                Dim::Named(BATCH),
                Dim::Named(SEQUENCE),
                Dim::Fixed(ctx.common.d_model),
            ];
            b.declare(&x, b.precision().data_type(), &dims);
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
    (emb, x)
}

/// Mean over lanes, `final_norm`, and the output projection tied to the first `rows`
/// rows of the embedding table (the float table `embedding` when there is one); float32
/// logits.
pub fn lm_head<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    final_norm: &Tensor,
    table: &Tensor,
    embedding: Option<&Value>,
    rows: usize,
    x: &Value,
) -> Value {
    let d_model = ctx.common.d_model;
    let x = b.reduce_mean(x, &[2]);
    let x = b.squeeze(&x, &[2]);
    let x = zc_rms_norm(b, ctx, &x, "final_norm", &final_norm.data);
    let logits = match embedding {
        Some(embedding) => {
            let head = if rows < table.shape[0] {
                b.slice(embedding, 0, 0, rows as i64)
            } else {
                embedding.clone()
            };
            let et = b.transpose(&head, &[1, 0]);
            b.matmul(&x, &et)
        }
        None => b.scope("embedding", |b| {
            match (ctx.matmul_weights(), &table.codes) {
                (MatMulWeights::Packed, Some(codes)) => cq_matmul(b, &x, &codes.first_rows(rows)),
                (MatMulWeights::Cq, Some(codes)) => {
                    let head = CqKernel::of(&[&codes.first_rows(rows)]).expect("one matrix");
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
