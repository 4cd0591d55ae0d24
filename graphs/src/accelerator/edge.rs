//! The accelerator graphs' integer work, all at the graph's edge: the engram's n-gram
//! hash and table fetch, and the window's validity, written only in ops that neither
//! CoreML nor NNAPI takes (`GatherElements`, `Einsum`, `BitwiseXor`/`BitwiseAnd`, `Mod`,
//! `ReduceMin`, `GreaterOrEqual`) and reading graph inputs only.
//! onnxruntime's partitioner closes an accelerator partition at any node it cannot take
//! that reads one the partition took, so a single accepted op (a `Cast`, an integer
//! `Mul`) inside this path would split the float island in two; with none, the CPU runs
//! the whole path first and the accelerator gets one partition.
//!
//! ```text
//! token_window ─GatherElements(ids as i64)─ Einsum(shift_j, active_j) ─ Xor ─ Einsum(·P or ·1) ─ And(2³²−1) ─ × max(orders)
//!   ─ acc ^ (acc >> 15, bit by bit) ─ Mod(slots) ─ Einsum(⊗ ones[sub]) ─▶ indices
//! indices ─ GatherElements(site's tables [T,1,slots,sub]) ─▶ [T, 1, N, sub] (the site transposes it)
//! position_ids ─ ReduceMin ─ GreaterOrEqual(W − i) ─▶ validity [1, N] (bool)
//! ```
//! The hash is `crate::blocks::engram`'s, every table at once: a table of order `o`
//! takes steps `j < o`; at later steps it xors 0 and multiplies by 1, which leave it as
//! it is.

use crate::blocks::engram::{table_seed, MASK32, PRIME};
use crate::builder::{Attr, GraphBuilder, Value};
use crate::geometry::EngramGeometry;
use crate::onnx::data_type;

/// `GatherElements` indices into a site's tables `[T, 1, slots, sub_dim]` (axis 2):
/// `[T, 1, N, sub_dim]` int64, table `t`'s row for the n-gram ending at each of the
/// `N = W + sequence` window positions. `token_window`: `[1, N]` int32.
pub fn table_indices(
    b: &mut GraphBuilder,
    e: &EngramGeometry,
    vocab: usize,
    token_window: &Value,
    n: usize,
) -> Value {
    b.scope("engram_hash", |b| {
        let t = e.num_tables;
        // int32 → int64 by lookup: a `Cast` is an op both EPs take (see the module doc).
        let every_id = b.const_bytes(
            data_type::INT64,
            &[1, vocab],
            (0..vocab as i64).flat_map(i64::to_le_bytes).collect(),
        );
        let ids = b.op1(
            "GatherElements",
            &[&every_id, token_window],
            vec![("axis", Attr::Int(1))],
        );
        let seeds: Vec<i64> = (0..t).map(|table| table_seed(e, table)).collect();
        let mut acc = b.const_i64(&seeds);
        let max_order = e.orders.iter().copied().max().unwrap_or(0);
        let mask = b.scalar_i64(MASK32);
        for j in 0..max_order {
            let active: Vec<bool> = (0..t).map(|table| order_of(e, table) > j).collect();
            let shift = b.const_bytes(data_type::INT64, &[n, n], shifted_tokens(n, j));
            let takes: Vec<i64> = active.iter().map(|&a| a as i64).collect();
            let takes = b.const_i64(&takes);
            let tok = einsum(b, "bm,mn,t->bnt", &[&ids, &shift, &takes]);
            let mixed = b.op1("BitwiseXor", &[&acc, &tok], vec![]);
            let factors: Vec<i64> = active.iter().map(|&a| if a { PRIME } else { 1 }).collect();
            let factors = b.const_i64(&factors);
            let product = einsum(b, "bnt,t->bnt", &[&mixed, &factors]);
            acc = b.op1("BitwiseAnd", &[&product, &mask], vec![]);
        }
        let high = shift_right_15(b, &acc);
        let acc = b.op1("BitwiseXor", &[&acc, &high], vec![]);
        let slots = b.scalar_i64(e.slots as i64);
        let slot = b.op1("Mod", &[&acc, &slots], vec![]);
        let ones = b.const_i64(&vec![1; e.sub_dim]);
        einsum(b, "bnt,s->tbns", &[&slot, &ones])
    })
}

/// `x >> 15` of int64 `x` in `[0, 2³²)`, bit by bit: bit `k` of `x` is
/// `(x & 2ᵏ) mod (2ᵏ − 1)` (2ᵏ leaves 1, 0 leaves 0), and the shifted value is the sum of
/// bits 15…31 weighted `2ᵏ⁻¹⁵`. (`BitShift` takes unsigned ints only, and the `Cast`
/// there would be an op both EPs take.)
fn shift_right_15(b: &mut GraphBuilder, x: &Value) -> Value {
    let bits: Vec<u32> = (15..32).collect();
    let ones = b.const_i64(&vec![1; bits.len()]);
    let spread = einsum(b, "bnt,k->bntk", &[x, &ones]);
    let powers: Vec<i64> = bits.iter().map(|&k| 1i64 << k).collect();
    let below: Vec<i64> = powers.iter().map(|p| p - 1).collect();
    let powers = b.const_i64(&powers);
    let below = b.const_i64(&below);
    let masked = b.op1("BitwiseAnd", &[&spread, &powers], vec![]);
    let bit = b.op1("Mod", &[&masked, &below], vec![]);
    let weights: Vec<i64> = bits.iter().map(|&k| 1i64 << (k - 15)).collect();
    let weights = b.const_i64(&weights);
    einsum(b, "bntk,k->bnt", &[&bit, &weights])
}

/// A site's fetched rows `[T, 1, N, sub_dim]` from its tables (`[T·slots, sub_dim]`
/// row-major, as [`crate::blocks::weights::EngramWeights`] holds them).
pub fn fetch_rows(
    b: &mut GraphBuilder,
    e: &EngramGeometry,
    tables: &[f32],
    indices: &Value,
) -> Value {
    let tables = b.weight("embedding", &[e.num_tables, 1, e.slots, e.sub_dim], tables);
    b.op1(
        "GatherElements",
        &[&tables, indices],
        vec![("axis", Attr::Int(2))],
    )
}

/// Whether each of the `N = W + sequence` window positions holds a token of the row:
/// `[1, N]` bool. History slot `i` holds position `p0 − W + i` (`p0`: the first new
/// position), so it is real when that is ≥ 0; the new positions are all taken as real
/// (a final chunk's padding comes after every real token, which reads only earlier ones).
pub fn window_validity(
    b: &mut GraphBuilder,
    position_ids: &Value,
    history: usize,
    n: usize,
) -> Value {
    let axis = b.const_i64(&[1]);
    let first = b.op1(
        "ReduceMin",
        &[position_ids, &axis],
        vec![("keepdims", Attr::Int(1))],
    );
    let thresholds: Vec<u8> = (0..n)
        .flat_map(|i| (history as i32 - i as i32).to_le_bytes())
        .collect();
    let thresholds = b.const_bytes(data_type::INT32, &[n], thresholds);
    b.op1("GreaterOrEqual", &[&first, &thresholds], vec![])
}

fn order_of(e: &EngramGeometry, table: usize) -> usize {
    e.orders[table / e.heads()]
}

fn einsum(b: &mut GraphBuilder, equation: &'static str, operands: &[&Value]) -> Value {
    b.op1("Einsum", operands, vec![("equation", Attr::Str(equation))])
}

/// `[N, N]` int64 little-endian: entry `(m, p)` is 1 when `m = p − j`, so `ids · it` is
/// each position's token `j` back (0 before the window's start).
fn shifted_tokens(n: usize, j: usize) -> Vec<u8> {
    let mut raw = vec![0u8; n * n * 8];
    for p in j..n {
        raw[((p - j) * n + p) * 8] = 1;
    }
    raw
}
