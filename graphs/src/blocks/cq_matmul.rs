//! `needle.CqMatMul` nodes (`packed` weight storage): a CQ matrix's codes, fp16 norms and
//! codebook go into the graph exactly as the `.cact` stores them, and the Needle kernels
//! multiply by the codes (`kernels/src/cq_matmul/mod.rs` states the op's contract).
//!
//! ```text
//! x [.., cols] ─ needle.CqMatMul(codes [rows, row bytes] u8, norms [rows, groups] f16,
//!                                codebook [2^bits] f32; cols, group, bits) ─ [.., rows]
//! ```

use crate::blocks::cq_node::cq_node;
use crate::blocks::cq_rows::codes_and_norms;
use crate::blocks::weights::CqRows;
use crate::builder::{Attr, Attrs, GraphBuilder, Value};
use crate::contract::needle_ops;

/// `x · Wᵀ` for the CQ matrix `w`; initializers `<scope>.codes`, `.norms`, `.codebook`.
pub fn cq_matmul(b: &mut GraphBuilder, x: &Value, w: &CqRows) -> Value {
    let stored = codes_and_norms(b, w);
    cq_matmul_stored(b, x, w, &stored)
}

/// [`cq_matmul`] by codes and norms of `w` already in the graph ([`codes_and_norms`],
/// which another node reads too: the tied embedding); initializer `<scope>.codebook`.
pub fn cq_matmul_stored(b: &mut GraphBuilder, x: &Value, w: &CqRows, stored: &[Value; 2]) -> Value {
    cq_node(b, needle_ops::CQ_MATMUL, &[x], w, stored, vec![], &[])
}

/// [`cq_matmul`] of the rows over `x`'s last `row_axes` axes, each divided by its root
/// mean square first (upstream `_rms_unit`): the Reshape and the norm in the one node.
pub fn cq_matmul_of_unit_rows(
    b: &mut GraphBuilder,
    x: &Value,
    w: &CqRows,
    row_axes: usize,
) -> Value {
    let stored = codes_and_norms(b, w);
    let attrs = vec![
        ("row_axes", Attr::Int(row_axes as i64)),
        ("unit_rows", Attr::Int(1)),
    ];
    cq_node(b, needle_ops::CQ_MATMUL, &[x], w, &stored, attrs, &[])
}

/// [`cq_matmul`] of `x`'s rows RMS-normalised and times `gain` `[cols]` (an `RMSNormalization`
/// with that scale, epsilon 1e-6): the norm in the product's node.
pub fn cq_matmul_rms_normed(b: &mut GraphBuilder, x: &Value, w: &CqRows, gain: &Value) -> Value {
    let stored = codes_and_norms(b, w);
    let attrs = vec![("unit_rows", Attr::Int(1))];
    cq_node(b, needle_ops::CQ_MATMUL, &[x], w, &stored, attrs, &[gain])
}

/// The attention heads `[out, p]` gated (`attrs`: the gate's layout) and projected by the
/// layer's output projection `w` in one `needle.AttentionOut` node.
pub fn attention_out_node(
    b: &mut GraphBuilder,
    inputs: [&Value; 2],
    w: &CqRows,
    attrs: Attrs,
) -> Value {
    let stored = codes_and_norms(b, w);
    cq_node(
        b,
        needle_ops::ATTENTION_OUT,
        &inputs,
        w,
        &stored,
        attrs,
        &[],
    )
}

/// An engram site's value by `needle.EngramValue` from the window's `rows`, `valid` and
/// the conv's `taps` (`attrs`: `dilation`, `history`), `value_proj` `w` as stored.
pub fn engram_value(
    b: &mut GraphBuilder,
    inputs: [&Value; 3],
    w: &CqRows,
    stored: &[Value; 2],
    attrs: Attrs,
) -> Value {
    cq_node(b, needle_ops::ENGRAM_VALUE, &inputs, w, stored, attrs, &[])
}

/// An engram site's masked rows by `needle.EngramRows` from the window's ids and validity
/// and the tables' seeds and orders (`attrs`: `slots`), the site's table `w` as stored.
pub fn engram_rows_node(
    b: &mut GraphBuilder,
    inputs: [&Value; 4],
    w: &CqRows,
    stored: &[Value; 2],
    attrs: Attrs,
) -> Value {
    cq_node(b, needle_ops::ENGRAM_ROWS, &inputs, w, stored, attrs, &[])
}
