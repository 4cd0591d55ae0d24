//! Rows of a CQ matrix decoded in the graph as they are gathered (upstream
//! `export._cq_unpack` for the gathered rows only), so a table of 10⁸ values stays as
//! its 2–4-bit codes in the file and in memory:
//!
//! ```text
//! rows ─Gather(codes)─ [.., bytes] ─Gather(byte of index k)─ (≫ shift) & mask ─Gather(codebook)─┐
//!      ─Gather(norms)─ [.., groups] ─Cast─────────────────────────────────────────────── · ─ @H ─ [.., cols]
//! ```
//! An index whose bits straddle two bytes (3-bit codes) is read from both, combined in
//! uint32.

use crate::builder::{Attr, GraphBuilder, Value};
use crate::needle::hadamard_mlp::walsh_hadamard;
use crate::needle::CqRows;
use crate::onnx::data_type;

/// Rows `indices` (int64, any shape `[..]`) of `table`: `[.., cols]` in the graph's
/// precision. Initializers are named `<scope>.<name>.codes` / `.norms` / `.codebook`.
pub fn gather_cq_rows(b: &mut GraphBuilder, name: &str, table: &CqRows, indices: &Value) -> Value {
    b.scope(name, |b| {
        let (groups, group, bits) = (table.groups(), table.group, table.index_bits);
        let padded = groups * group;
        let row_bytes = table.row_bytes();
        let codes = b.weight_bytes(
            "codes",
            data_type::UINT8,
            &[table.rows, row_bytes],
            table.codes.clone(),
        );
        let norms_raw = table.norms.iter().flat_map(|n| n.to_le_bytes()).collect();
        let norms = b.weight_bytes(
            "norms",
            data_type::FLOAT16,
            &[table.rows, groups],
            norms_raw,
        );
        let codebook = b.weight("codebook", &[table.codebook.len()], &table.codebook);

        let row_codes = b.gather(&codes, indices, 0);
        let first_bit: Vec<usize> = (0..padded).map(|k| k * bits).collect();
        let byte_of = |extra: usize| -> Vec<i64> {
            first_bit
                .iter()
                .map(|bit| ((bit / 8 + extra).min(row_bytes - 1)) as i64)
                .collect()
        };
        let low = b.const_i64(&byte_of(0));
        let low = b.gather(&row_codes, &low, -1);
        let mut word = b.cast(&low, data_type::UINT32);
        if first_bit.iter().any(|bit| bit % 8 + bits > 8) {
            let high = b.const_i64(&byte_of(1));
            let high = b.gather(&row_codes, &high, -1);
            let high = b.cast(&high, data_type::UINT32);
            let eight = uint32s(b, &[8]);
            let high = b.op1("BitShift", &[&high, &eight], vec![("direction", left())]);
            word = b.op1("BitwiseOr", &[&word, &high], vec![]);
        }
        let shifts: Vec<u32> = first_bit.iter().map(|bit| (bit % 8) as u32).collect();
        let shifts = uint32s(b, &shifts);
        let word = b.op1("BitShift", &[&word, &shifts], vec![("direction", right())]);
        let mask = uint32s(b, &[(1u32 << bits) - 1]);
        let index = b.op1("BitwiseAnd", &[&word, &mask], vec![]);
        let index = b.cast(&index, data_type::INT64);
        let values = b.gather(&codebook, &index, 0);

        let row_norms = b.gather(&norms, indices, 0);
        let float = b.precision().data_type();
        let row_norms = b.cast(&row_norms, float);
        let row_norms = b.unsqueeze(&row_norms, &[-1]);
        let shape = b.shape_of(indices, 0, i64::MAX);
        let grouped_shape = b.const_i64(&[groups as i64, group as i64]);
        let grouped_shape = b.concat(&[&shape, &grouped_shape], 0);
        let grouped = b.op1("Reshape", &[&values, &grouped_shape], vec![]);
        let scaled = b.mul(&grouped, &row_norms);
        let h = b.const_float(&[group, group], &walsh_hadamard(group));
        let rotated = b.matmul(&scaled, &h);
        let flat_shape = b.const_i64(&[padded as i64]);
        let flat_shape = b.concat(&[&shape, &flat_shape], 0);
        let rows = b.op1("Reshape", &[&rotated, &flat_shape], vec![]);
        if padded > table.cols {
            b.slice(&rows, -1, 0, table.cols as i64)
        } else {
            rows
        }
    })
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
