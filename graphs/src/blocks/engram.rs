//! Needle `Engram` n-gram memory (`architecture.py` `Engram`, `engram_indices`;
//! the cached form is `decode.py` `_engram_kv`). For every position, each
//! (order, head) table hashes the n-gram ending there,
//! `acc = seed; for j < order: acc = (acc ^ tok[t-j]) · 0x01000193 (mod 2³²);
//! acc ^= acc >> 15; slot = acc mod slots`, gathers a row, zeroes rows whose n-gram
//! starts before the first valid token, and projects the concatenation to a key
//! and a value; the value then passes a 4-tap causal conv with dilation
//! `max(orders)`. Hashing runs in int64 with an explicit 32-bit mask, which is
//! exactly upstream's uint32 arithmetic (the product stays below 2⁵⁷).
//!
//! The window is each row's own: its last `W` real tokens before this call (from the
//! token history, `crate::blocks::token_history`) then the new tokens, real where `position_ids`/the mask say so, so rows of a padded batch are
//! exact.
//!
//! ```text
//! ids window [B, W+S] ─hash─ Gather(tables) ·ngram_ok ─┬ key_proj ─ rms_unit ─▶ ek [B,S,d]
//!                                                       └ value_proj ─ Σ taps_j·shift(j·dil)·tap_ok_j ─▶ ev [B,S,d]
//! ```
//! At the site's layer (`Block.__call__` with `engram_kv`):
//! `x + σ(⟨rms_unit(x), ek⟩ / √d) · ev`.

use crate::blocks::attention::projection;
use crate::blocks::block_quant::gather_table;
use crate::blocks::context::{BuildContext, OpForms};
use crate::blocks::cq_matmul::{engram_rows_node, engram_value};
use crate::blocks::cq_rows::{codes_and_norms, gather_cq_rows};
use crate::blocks::norms::rms_unit;
use crate::blocks::weights::{CqRows, EngramTables, EngramWeights};
use crate::builder::{Attr, Dim, GraphBuilder, Value};
use crate::contract::dims::{BATCH, ENGRAM_WINDOW, SEQUENCE};
use crate::contract::needle_ops;
use crate::geometry::EngramGeometry;
use crate::onnx::data_type;

const SEED: u64 = 0x9E37_79B9;
/// The FNV prime the n-gram hash multiplies by, and the 32-bit mask it works under.
pub(crate) const PRIME: i64 = 0x0100_0193;
pub(crate) const MASK32: i64 = 0xFFFF_FFFF;

/// Token ids and validity of the last `W + sequence` positions of each row, where
/// `W = conv_taps · dilation` ([`EngramGeometry::history`]) is the history the n-grams and
/// taps reach back.
pub struct EngramWindow {
    /// `[batch, W + sequence]` int64.
    pub ids: Value,
    /// `[batch, W + sequence]` float, 1 for a valid token.
    pub valid: Value,
}

/// Key (already unit-RMS normalised) and value of one site for the new positions.
pub struct EngramKv {
    pub key_unit: Value,
    pub value: Value,
}

/// The hash seed of table `table` (order `table / heads`, head `table mod heads`):
/// `SEED · (order_index · seed_stride + head + 1) mod 2³²`.
pub(crate) fn table_seed(e: &EngramGeometry, table: usize) -> i64 {
    let (order_index, head) = (table / e.heads(), table % e.heads());
    let seed = SEED * ((order_index * e.seed_stride + head) as u64 + 1);
    (seed & MASK32 as u64) as i64
}

/// Flat table row per (position, table): `[batch, W + sequence, num_tables]` int64.
pub fn hashed_rows(b: &mut GraphBuilder, ids: &Value, e: &EngramGeometry) -> Value {
    b.scope("engram_hash", |b| {
        let heads = e.heads();
        let mut rows = Vec::new();
        for (oi, &order) in e.orders.iter().enumerate() {
            for h in 0..heads {
                let mut acc = b.scalar_i64(table_seed(e, oi * heads + h));
                for j in 0..order {
                    let tok = shift_right(b, OpForms::Onnx, ids, j, data_type::INT64, &WINDOW_DIMS);
                    let x = b.op1("BitwiseXor", &[&acc, &tok], vec![]);
                    let prime = b.scalar_i64(PRIME);
                    let m = b.mul(&x, &prime);
                    let mask = b.scalar_i64(MASK32);
                    acc = b.op1("BitwiseAnd", &[&m, &mask], vec![]);
                }
                let div = b.scalar_i64(1 << 15);
                let high = b.div(&acc, &div);
                let acc = b.op1("BitwiseXor", &[&acc, &high], vec![]);
                let slots = b.scalar_i64(e.slots as i64);
                let slot = b.op1("Mod", &[&acc, &slots], vec![]);
                let base = b.scalar_i64(((oi * heads + h) * e.slots) as i64);
                let row = b.add(&slot, &base);
                rows.push(b.unsqueeze(&row, &[-1]));
            }
        }
        let refs: Vec<&Value> = rows.iter().collect();
        b.concat(&refs, -1)
    })
}

/// Each row's window: its last `W` real tokens before this call ++ `input_ids`, real where the row has a token there.
/// A history slot `j` holds the token at position `p0 − W + j` (`p0`: the row's first new
/// position), so it is real when that is ≥ 0; a new column is real where the mask says so.
/// `new_mask`: the mask's last `sequence` columns `[batch, sequence]` int64.
pub fn window<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    past_ids: &Value,
    input_ids: &Value,
    new_mask: &Value,
    position_ids: &Value,
) -> EngramWindow {
    let history = ctx.common.engram.history() as i64;
    let ids = b.concat(&[past_ids, input_ids], 1);
    b.declare(&ids, data_type::INT64, &WINDOW_DIMS);
    let first = b.slice(position_ids, 1, 0, 1);
    let slots = b.const_i64(&(0..history).collect::<Vec<_>>());
    let reached = b.add(&first, &slots);
    let w = b.scalar_i64(history);
    let seen = b.op1("GreaterOrEqual", &[&reached, &w], vec![]);
    let seen = b.cast(&seen, data_type::INT64);
    let valid = b.concat(&[&seen, new_mask], 1);
    let float = b.precision().data_type();
    let valid = b.cast(&valid, float);
    b.declare(&valid, float, &WINDOW_DIMS);
    EngramWindow { ids, valid }
}

/// Keys and values of every engram site for the new positions.
pub fn site_kvs<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    sites: &[EngramWeights],
    window: &EngramWindow,
) -> Vec<EngramKv> {
    if sites.is_empty() {
        return Vec::new();
    }
    // With the Needle ops, each site hashes, gathers and masks its rows in one node, from
    // its CQ codes (Needle 2 keeps them beside its dense tables).
    let codes: Option<Vec<&CqRows>> = sites
        .iter()
        .map(|s| match &s.tables {
            EngramTables::Codes(t) => Some(t),
            EngramTables::Dense(t) => t.codes.as_deref(),
        })
        .collect();
    if let (true, Some(codes)) = (ctx.kernels.needle_ops, codes) {
        return sites
            .iter()
            .zip(codes)
            .enumerate()
            .map(|(s, (ew, table))| {
                b.scope(format!("engrams.{s}"), |b| {
                    let rows = b.scope("embedding", |b| engram_rows(b, ctx, window, table));
                    site_projections(b, ctx, &window.valid, &rows, ew)
                })
            })
            .collect();
    }
    let rows = hashed_rows(b, &window.ids, &ctx.common.engram);
    sites
        .iter()
        .enumerate()
        .map(|(s, ew)| {
            b.scope(format!("engrams.{s}"), |b| {
                engram(b, ctx, window, &rows, ew)
            })
        })
        .collect()
}

/// A site's masked rows `[batch, W + sequence, num_tables · sub_dim]` by one
/// `needle.EngramRows` node: the hash of every table, its CQ rows decoded, the n-grams that
/// start before the row's first token zeroed.
fn engram_rows<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    window: &EngramWindow,
    table: &CqRows,
) -> Value {
    let e = &ctx.common.engram;
    let seeds: Vec<i64> = (0..e.num_tables).map(|t| table_seed(e, t)).collect();
    let orders: Vec<i64> = (0..e.num_tables)
        .map(|t| e.orders[t / e.heads()] as i64)
        .collect();
    let (seeds, orders) = (b.const_i64(&seeds), b.const_i64(&orders));
    let stored = codes_and_norms(b, table);
    let attrs = vec![("slots", Attr::Int(e.slots as i64))];
    let inputs = [&window.ids, &window.valid, &seeds, &orders];
    engram_rows_node(b, inputs, table, &stored, attrs)
}

/// Keys and values of one engram site. `rows`: from [`hashed_rows`].
pub fn engram<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    window: &EngramWindow,
    rows: &Value,
    w: &EngramWeights,
) -> EngramKv {
    let fetched = match &w.tables {
        EngramTables::Dense(t) => gather_table(b, ctx.matmul_weights(), "embedding", t, rows),
        EngramTables::Codes(t) => gather_cq_rows(b, "embedding", t, rows, ctx.kernels.needle_ops),
    };
    engram_kv(b, ctx, &window.valid, &fetched, w)
}

/// Keys and values of one engram site from its tables' rows for the window, `fetched`
/// `[batch, W + sequence, num_tables, sub_dim]`: n-grams that start before the row's first
/// token zeroed, the key and value projections and the value's causal taps. `valid`: the
/// window's validity, as [`EngramWindow::valid`].
pub fn engram_kv<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    valid: &Value,
    fetched: &Value,
    w: &EngramWeights,
) -> EngramKv {
    let e = &ctx.common.engram;
    let forms = ctx.kernels.op_forms;
    let (nt, sub) = (e.num_tables, e.sub_dim);
    let float = b.precision().data_type();
    let per_table: Vec<Value> = (0..nt)
        .map(|t| {
            let order = e.orders[t / e.heads()];
            shift_right(b, forms, valid, order - 1, float, &WINDOW_DIMS)
        })
        .collect();
    let per_table: Vec<Value> = per_table
        .iter()
        .map(|v| b.unsqueeze(v, &[-1, -2]))
        .collect();
    let refs: Vec<&Value> = per_table.iter().collect();
    let ngram_ok = b.concat(&refs, 2);
    let fetched = b.mul(fetched, &ngram_ok);
    let concatenated = b.reshape(&fetched, &[0, 0, (nt * sub) as i64]);
    site_projections(b, ctx, valid, &concatenated, w)
}

/// Keys and values of one engram site from its masked rows `concatenated`
/// `[batch, W + sequence, num_tables · sub_dim]`: the key and value projections and the
/// value's causal taps.
fn site_projections<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    valid: &Value,
    concatenated: &Value,
    w: &EngramWeights,
) -> EngramKv {
    let e = &ctx.common.engram;
    let forms = ctx.kernels.op_forms;
    let d_model = ctx.common.d_model;
    let (nt, sub) = (e.num_tables, e.sub_dim);
    let history = e.history() as i64;
    let float = b.precision().data_type();
    let [batch, window_len] = WINDOW_DIMS;
    let v_dims = [batch.clone(), window_len, Dim::Fixed(d_model)];
    let new_dims = [batch, Dim::Named(SEQUENCE), Dim::Fixed(d_model)];

    let e_new = b.slice(concatenated, 1, history, i64::MAX);
    b.declare(
        &e_new,
        float,
        &[
            Dim::Named(BATCH),
            Dim::Named(SEQUENCE),
            Dim::Fixed(nt * sub),
        ],
    );
    let key = projection(b, ctx, &e_new, "key_proj", &w.key_proj);
    let key_unit = rms_unit(b, ctx, &key, d_model);

    let taps = b.weight("taps", &w.taps.shape, &w.taps.data);
    if let (true, Some(codes)) = (ctx.kernels.needle_ops, &w.value_proj.codes) {
        let value = b.scope("value_proj", |b| {
            let stored = codes_and_norms(b, codes);
            let attrs = vec![
                ("dilation", Attr::Int(e.dilation as i64)),
                ("history", Attr::Int(history)),
            ];
            engram_value(b, [concatenated, valid, &taps], codes, &stored, attrs)
        });
        b.declare(&value, float, &new_dims);
        return EngramKv { key_unit, value };
    }
    let v = projection(b, ctx, concatenated, "value_proj", &w.value_proj);
    let mut conv: Option<Value> = None;
    for j in 0..e.conv_taps {
        let tap = b.scalar_i64(j as i64);
        let tap = b.gather(&taps, &tap, 0);
        let shift = j * e.dilation;
        let shifted = shift_right(b, forms, &v, shift, float, &v_dims);
        let ok = shift_right(b, forms, valid, shift, float, &WINDOW_DIMS);
        let ok = b.unsqueeze(&ok, &[-1]);
        let term = b.mul(&tap, &shifted);
        let term = b.mul(&term, &ok);
        conv = Some(match conv {
            None => term,
            Some(acc) => b.add(&acc, &term),
        });
    }
    let value = b.slice(&conv.expect("conv_taps > 0"), 1, history, i64::MAX);
    b.declare(&value, float, &new_dims);
    EngramKv { key_unit, value }
}

/// `x + σ(Σ_d rms_unit(x)·ek / √d) · ev` at an engram site's layer.
pub fn inject<C>(b: &mut GraphBuilder, ctx: &BuildContext<C>, x: &Value, kv: &EngramKv) -> Value {
    let d_model = ctx.common.d_model;
    b.scope("engram_gate", |b| {
        if ctx.kernels.needle_ops {
            let inputs = [x, &kv.key_unit, &kv.value];
            return b
                .op_in(
                    needle_ops::DOMAIN,
                    needle_ops::ENGRAM_GATE,
                    &inputs,
                    vec![],
                    1,
                )
                .remove(0);
        }
        let xu = rms_unit(b, ctx, x, d_model);
        let products = b.mul(&xu, &kv.key_unit);
        let root_d = (d_model as f64).sqrt() as f32;
        let logit = match ctx.kernels.op_forms {
            OpForms::Onnx => {
                let dot = b.reduce_sum(&products, &[-1], true);
                let root_d = b.scalar_float(root_d);
                b.div(&dot, &root_d)
            }
            // NNAPI has no `ReduceSum`: `Σ/√d` is `mean·√d`.
            OpForms::MobileAccelerators => {
                let mean = b.reduce_mean(&products, &[-1]);
                let root_d = b.scalar_float(root_d);
                b.mul(&mean, &root_d)
            }
        };
        let alpha = b.sigmoid(&logit);
        let add = b.mul(&alpha, &kv.value);
        b.add(x, &add)
    })
}

/// `x` shifted right by `k` along axis 1 (rank `rank`), zeros entering at the front.
/// `dims`/`elem_type` are `x`'s, declared on the result so shape inference keeps them.
pub fn shift_right(
    b: &mut GraphBuilder,
    forms: OpForms,
    x: &Value,
    k: usize,
    elem_type: i32,
    dims: &[Dim],
) -> Value {
    if k == 0 {
        return x.clone();
    }
    let k = k as i64;
    let shifted = match forms {
        OpForms::Onnx => {
            let padded = b.pad_front(x, dims.len(), 1, k);
            b.slice(&padded, 1, 0, -k)
        }
        // CoreML's MLProgram has no `Pad`: the zeros are `x`'s first `k` columns times 0
        // (a float `x`; finite, so exactly 0).
        OpForms::MobileAccelerators => {
            let head = b.slice(x, 1, 0, k);
            let zero = b.scalar_float(0.0);
            let zeros = b.mul(&head, &zero);
            let kept = b.slice(x, 1, 0, -k);
            b.concat(&[&zeros, &kept], 1)
        }
    };
    b.declare(&shifted, elem_type, dims);
    shifted
}

/// `[batch, engram_window]`: the window of `W + sequence` positions the engram reads.
pub const WINDOW_DIMS: [Dim; 2] = [Dim::Named(BATCH), Dim::Named(ENGRAM_WINDOW)];
