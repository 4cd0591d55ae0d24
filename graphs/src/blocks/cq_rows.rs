//! Rows of a CQ matrix decoded in the graph as they are gathered (upstream
//! `export._cq_unpack` for the gathered rows only), so a table of 10⁸ values stays as
//! its 1–4-bit codes in the file and in memory:
//!
//! ```text
//! rows ─Gather(codes)─ [.., bytes] ─Cast─Gather(values of each byte's codes)─ [.., groups, group] ─┐
//!      ─Gather(norms)─ [.., groups] ─Cast──────────────────────────────────────────────────────── · ─ @H ─ [.., cols]
//! ```
//! The rotation sums like the `.cact` reader does ([`rotate`]), so the rows are the
//! reader's bit for bit.
//! 3-bit codes straddle bytes: each index is read from its two bytes, combined, shifted
//! and masked in uint32, and looked up in the codebook.

use crate::blocks::cq_node::cq_node;
use crate::blocks::hadamard::walsh_hadamard;
use crate::blocks::weights::CqRows;
use crate::builder::{Attr, GraphBuilder, Value};
use crate::contract::{needle_ops, Precision};
use crate::onnx::data_type;

/// Rows `indices` (int64, any shape `[..]`) of `table`: `[.., cols]` in the graph's
/// precision. Initializers are named `<scope>.<name>.codes` / `.norms` / `.byte_values`
/// (or `.codebook`).
/// With `needle_ops`, one `needle.CqGather` node decodes them instead.
pub fn gather_cq_rows(
    b: &mut GraphBuilder,
    name: &str,
    table: &CqRows,
    indices: &Value,
    needle_ops: bool,
) -> Value {
    b.scope(name, |b| {
        let stored = codes_and_norms(b, table);
        match needle_ops {
            true => cq_gather_stored(b, indices, table, &stored),
            false => gather_stored_rows(b, table, &stored, indices),
        }
    })
}

/// Rows `indices` (int64, any shape) of `w` decoded as they are gathered
/// (`needle.CqGather`), from codes and norms already in the graph; `[indices.., cols]`.
pub fn cq_gather_stored(
    b: &mut GraphBuilder,
    indices: &Value,
    w: &CqRows,
    stored: &[Value; 2],
) -> Value {
    cq_node(b, needle_ops::CQ_GATHER, &[indices], w, stored, vec![], &[])
}

/// [`gather_cq_rows`] from codes and norms already in the graph ([`codes_and_norms`], which
/// another node reads too); the value lookup is `<scope>.byte_values` (or `.codebook`).
pub(crate) fn gather_stored_rows(
    b: &mut GraphBuilder,
    table: &CqRows,
    [codes, norms]: &[Value; 2],
    indices: &Value,
) -> Value {
    let lookup = value_lookup(b, table);
    let codes = b.gather(codes, indices, 0);
    let norms = b.gather(norms, indices, 0);
    let lead = b.shape_of(indices, 0, i64::MAX);
    decode(b, table, &lookup, [&codes, &norms], &lead)
}

/// What a code reads its value from, in the graph's precision: for whole-byte codes the
/// values of every byte's codes `[256, codes per byte]`, else the codebook.
fn value_lookup(b: &mut GraphBuilder, table: &CqRows) -> Value {
    let bits = table.index_bits;
    match whole_byte_codes(bits) {
        Some(per_byte) => {
            let values = byte_values(&table.codebook, bits);
            b.weight("byte_values", &[256, per_byte], &values)
        }
        None => b.weight("codebook", &[table.codebook.len()], &table.codebook),
    }
}

/// The matrix's codes `[rows, row bytes]` (uint8) and fp16 norms `[rows, groups]` as the
/// `.cact` stores them: initializers `<scope>.codes` and `<scope>.norms`.
pub(crate) fn codes_and_norms(b: &mut GraphBuilder, table: &CqRows) -> [Value; 2] {
    let codes = b.weight_bytes(
        "codes",
        data_type::UINT8,
        &[table.rows, table.row_bytes()],
        table.codes.clone(),
    );
    let norms_raw = table.norms.iter().flat_map(|n| n.to_le_bytes()).collect();
    let norms = b.weight_bytes(
        "norms",
        data_type::FLOAT16,
        &[table.rows, table.groups()],
        norms_raw,
    );
    [codes, norms]
}

/// `[lead.., cols]` from rows of codes `[lead.., row bytes]` and their norms
/// `[lead.., groups]`.
fn decode(
    b: &mut GraphBuilder,
    table: &CqRows,
    lookup: &Value,
    [row_codes, row_norms]: [&Value; 2],
    lead: &Value,
) -> Value {
    let (groups, group, bits) = (table.groups(), table.group, table.index_bits);
    let padded = groups * group;
    let row_bytes = table.row_bytes();
    let index = match whole_byte_codes(bits) {
        // Each byte indexes the values of all its codes at once.
        Some(_) => b.cast(row_codes, data_type::INT32),
        None => straddling_indices(b, row_codes, bits, padded, row_bytes),
    };
    let values = b.gather(lookup, &index, 0);
    let row_norms = b.cast(row_norms, b.precision().data_type());
    let row_norms = b.unsqueeze(&row_norms, &[-1]);
    let grouped_shape = b.const_i64(&[groups as i64, group as i64]);
    let grouped_shape = b.concat(&[lead, &grouped_shape], 0);
    let grouped = b.op1("Reshape", &[&values, &grouped_shape], vec![]);
    let scaled = b.mul(&grouped, &row_norms);
    let float = b.precision().data_type();
    let rotated = rotate(b, &scaled, group, groups == 1, RotatedAxis::Rows, float);
    let flat_shape = b.const_i64(&[padded as i64]);
    let flat_shape = b.concat(&[lead, &flat_shape], 0);
    let rows = b.op1("Reshape", &[&rotated, &flat_shape], vec![]);
    if padded > table.cols {
        b.slice(&rows, -1, 0, table.cols as i64)
    } else {
        rows
    }
}

/// Which axis of the values [`rotate`] contracts with `H`.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum RotatedAxis {
    /// `x @ H`: each row of the last axis is one group (rows of a table).
    Rows,
    /// `H @ x`: each column of the second-to-last axis is one group (a MatMul kernel).
    Columns,
}

/// Every group of `x` (`[.., group]` or `[.., group, n]`, of type `float`) rotated by the
/// Walsh–Hadamard matrix `H`, summed in the order the `.cact` reader sums `codes @ H`
/// (upstream numpy's BLAS), so the values are the reader's bit for bit: onnxruntime's
/// MatMul runs one FMA chain down `k` like sgemm does for a matrix of several groups;
/// numpy hands a matrix of one group to sgemv instead, which chains 8 terms at a time and
/// adds the partial sums in turn, so there the product is 8-term MatMuls added one by one.
pub(crate) fn rotate(
    b: &mut GraphBuilder,
    x: &Value,
    group: usize,
    single_group: bool,
    axis: RotatedAxis,
    float: i32,
) -> Value {
    const CHAIN: usize = 8;
    let h = walsh_hadamard(group);
    let encode = |values: &[f32]| match float {
        data_type::FLOAT16 => Precision::Fp16.encode(values),
        _ => Precision::Fp32.encode(values),
    };
    let times_h = |b: &mut GraphBuilder, x: &Value, h: Value| match axis {
        RotatedAxis::Rows => b.matmul(x, &h),
        RotatedAxis::Columns => b.matmul(&h, x),
    };
    if !single_group || group <= CHAIN || !group.is_multiple_of(CHAIN) {
        let h = b.const_bytes(float, &[group, group], encode(&h));
        return times_h(b, x, h);
    }
    let blocks = group / CHAIN;
    let split_axis = match axis {
        RotatedAxis::Rows => -1,
        RotatedAxis::Columns => -2,
    };
    let sizes = b.const_i64(&vec![CHAIN as i64; blocks]);
    let chunks = b.op(
        "Split",
        &[x, &sizes],
        vec![("axis", Attr::Int(split_axis))],
        blocks,
    );
    let partial: Vec<Value> = chunks
        .iter()
        .enumerate()
        .map(|(c, chunk)| {
            // Rows `c·CHAIN..` of H (= its columns, H being symmetric).
            let rows = &h[c * CHAIN * group..(c + 1) * CHAIN * group];
            let shape = match axis {
                RotatedAxis::Rows => [CHAIN, group],
                RotatedAxis::Columns => [group, CHAIN],
            };
            let block: Vec<f32> = match axis {
                RotatedAxis::Rows => rows.to_vec(),
                RotatedAxis::Columns => (0..group)
                    .flat_map(|m| (0..CHAIN).map(move |t| rows[t * group + m]))
                    .collect(),
            };
            let block = b.const_bytes(float, &shape, encode(&block));
            times_h(b, chunk, block)
        })
        .collect();
    partial[1..]
        .iter()
        .fold(partial[0].clone(), |sum, p| b.add(&sum, p))
}

/// Codes per byte when no code straddles two bytes (1, 2 and 4 bits; ternary crumbs).
pub(crate) fn whole_byte_codes(bits: usize) -> Option<usize> {
    (8 % bits == 0).then_some(8 / bits)
}

/// `[256, 8 / bits]`: the values of the codes of each byte value, LSB-first.
pub(crate) fn byte_values(codebook: &[f32], bits: usize) -> Vec<f32> {
    let mask = (1usize << bits) - 1;
    (0..256usize)
        .flat_map(|byte| (0..8 / bits).map(move |k| (byte >> (k * bits)) & mask))
        .map(|code| codebook[code])
        .collect()
}

/// The int32 index of each of the `padded` codes of rows `[lead.., row bytes]` (3-bit
/// codes): the byte(s) it lies in, shifted and masked in uint32.
fn straddling_indices(
    b: &mut GraphBuilder,
    row_codes: &Value,
    bits: usize,
    padded: usize,
    row_bytes: usize,
) -> Value {
    let first_bit: Vec<usize> = (0..padded).map(|k| k * bits).collect();
    let byte_of = |extra: usize| -> Vec<i64> {
        first_bit
            .iter()
            .map(|bit| ((bit / 8 + extra).min(row_bytes - 1)) as i64)
            .collect()
    };
    let low = b.const_i64(&byte_of(0));
    let low = b.gather(row_codes, &low, -1);
    let low = b.cast(&low, data_type::UINT32);
    let high = b.const_i64(&byte_of(1));
    let high = b.gather(row_codes, &high, -1);
    let high = b.cast(&high, data_type::UINT32);
    let eight = uint32s(b, &[8]);
    let high = b.op1("BitShift", &[&high, &eight], vec![("direction", left())]);
    let word = b.op1("BitwiseOr", &[&low, &high], vec![]);
    let shifts: Vec<u32> = first_bit.iter().map(|bit| (bit % 8) as u32).collect();
    let shifts = uint32s(b, &shifts);
    let word = b.op1("BitShift", &[&word, &shifts], vec![("direction", right())]);
    let mask = uint32s(b, &[(1u32 << bits) - 1]);
    let index = b.op1("BitwiseAnd", &[&word, &mask], vec![]);
    b.cast(&index, data_type::INT32)
}

fn uint32s(b: &mut GraphBuilder, values: &[u32]) -> Value {
    let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    b.const_bytes(data_type::UINT32, &[values.len()], raw)
}

fn left() -> Attr {
    Attr::Str("LEFT")
}

fn right() -> Attr {
    Attr::Str("RIGHT")
}
