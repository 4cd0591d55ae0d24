//! The token history ([`crate::contract::names::token_history`]): each row's past token
//! ids, kept in one more KV-cache pair after the attention layers' so that whatever
//! crops, copies or rewinds the cache (onnxruntime-genai's `rewind_to`, needle-run's
//! batch relayouts) does the same to the history. The engram reads each row's last
//! `engram_history` real tokens from it.
//!
//! ```text
//! input_ids ─ (id / 1024, id mod 1024) ─ zero-padded to a key/value row ─ written like a key ─▶ present.{L}
//! past_key_values.{L} ─ channels 0..2 of head 0 ─ ids ─ TopK(last real columns) ─▶ [batch, engram_history]
//! ```
//!
//! The ids are written where the variant's attention writes keys: the fused graph runs a
//! `GroupQueryAttention` node over them (it alone updates a shared past/present buffer in
//! place; its output, attention with a zero query, is unused), which packs each row's
//! tokens from slot 0; the reference graph concatenates them at the mask's columns.

use crate::blocks::attention::{attention_core, declare_present, CoreInputs, KvPair};
use crate::builder::{Attr, Dim, GraphBuilder, Value};
use crate::contract::dims::BATCH;
use crate::contract::{AttentionKind, HeadShape, ID_SPLIT};
use crate::onnx::data_type;

/// Each row's last `width` real tokens before this call, oldest first, zeros before the
/// row's first token: `[batch, width]` int64. `past`: the history pair's inputs (possibly
/// buffers longer than the past); `past_mask`: the mask's past columns
/// `[batch, past_sequence]`; `past_len`: `[1]`, the past's length.
pub fn last_tokens(
    b: &mut GraphBuilder,
    attention: AttentionKind,
    past: &KvPair,
    past_mask: &Value,
    past_len: &Value,
    width: usize,
) -> Value {
    // One Slice for head 0, the past's columns and channels 0..2: slicing the columns
    // first copied every head and channel (2.6 ms of a 186 ms step at batch 16, past 600).
    let from = b.const_i64(&[0, 0, 0]);
    let (head, channels) = (b.const_i64(&[1]), b.const_i64(&[2]));
    let to = b.concat(&[&head, past_len, &channels], 0);
    let axes = b.const_i64(&[1, 2, 3]);
    let parts = b.op1("Slice", &[&past.key, &from, &to, &axes], vec![]);
    let parts = b.squeeze(&parts, &[1]);
    let parts = b.cast(&parts, data_type::INT64);
    let high = b.slice(&parts, 2, 0, 1);
    let low = b.slice(&parts, 2, 1, 2);
    let split = b.scalar_i64(ID_SPLIT);
    let high = b.mul(&high, &split);
    let ids = b.add(&high, &low);
    let ids = b.squeeze(&ids, &[2]);

    let start = b.scalar_i64(0);
    let end = b.squeeze(past_len, &[0]);
    let step = b.scalar_i64(1);
    let columns = b.op1("Range", &[&start, &end, &step], vec![]);
    let real = match attention {
        // Packed from slot 0: the first `count` columns are the row's.
        AttentionKind::Fused(_) => {
            let count = b.reduce_sum(past_mask, &[1], true);
            b.op1("Less", &[&columns, &count], vec![])
        }
        AttentionKind::Reference => b.cast(past_mask, data_type::BOOL),
    };
    // Rank the columns: a real one by its place (later is higher), padding lowest; `width`
    // zero tokens ranked below every real one go first, so the top `width` are the last
    // real tokens, then as many zeros as the row lacks.
    let offset = b.scalar_i64(width as i64 + 1);
    let ranked = b.add(&columns, &offset);
    let zero = b.scalar_i64(0);
    let rank = b.where_(&real, &ranked, &zero);
    let batch = b.shape_of(past_mask, 0, 1);
    let fill_width = b.const_i64(&[width as i64]);
    let fill_shape = b.concat(&[&batch, &fill_width], 0);
    let fill_rank = b.const_i64(&(1..=width as i64).collect::<Vec<_>>());
    let fill_rank = b.op1("Expand", &[&fill_rank, &fill_shape], vec![]);
    let fill_ids = b.op1("Expand", &[&zero, &fill_shape], vec![]);
    let rank = b.concat(&[&fill_rank, &rank], 1);
    let ids = b.concat(&[&fill_ids, &ids], 1);
    let k = b.const_i64(&[width as i64]);
    let top = b.op(
        "TopK",
        &[&rank, &k],
        vec![
            ("axis", Attr::Int(1)),
            ("largest", Attr::Int(1)),
            ("sorted", Attr::Int(1)),
        ],
        2,
    );
    let (from_end, to_start, axis, back) = (
        b.const_i64(&[-1]),
        b.const_i64(&[i64::MIN]),
        b.const_i64(&[1]),
        b.const_i64(&[-1]),
    );
    let oldest_first = b.op1(
        "Slice",
        &[&top[1], &from_end, &to_start, &axis, &back],
        vec![],
    );
    let last = b.op1(
        "GatherElements",
        &[&ids, &oldest_first],
        vec![("axis", Attr::Int(1))],
    );
    b.declare(
        &last,
        data_type::INT64,
        &[Dim::Named(BATCH), Dim::Fixed(width)],
    );
    last
}

/// The history pair after this call: `past` with `input_ids` written where the
/// variant's attention (`core`) writes this call's keys. `shape`: the attention layers'
/// heads, whose cache the pair is shaped like.
pub fn append(
    b: &mut GraphBuilder,
    core: &CoreInputs,
    attention: AttentionKind,
    past: &KvPair,
    input_ids: &Value,
    shape: HeadShape,
) -> KvPair {
    let split = b.scalar_i64(ID_SPLIT);
    let high = b.div(input_ids, &split);
    let low = b.op1("Mod", &[input_ids, &split], vec![]);
    let high = b.unsqueeze(&high, &[-1]);
    let low = b.unsqueeze(&low, &[-1]);
    let parts = b.concat(&[&high, &low], -1);
    let float = b.precision().data_type();
    let parts = b.cast(&parts, float);
    let (key_dim, value_dim) = (
        shape.cached_key_dim(attention),
        shape.cached_value_dim(attention),
    );
    let kv = shape.kv_heads;
    match core {
        CoreInputs::Fused { .. } => {
            let k = b.pad_back(&parts, 3, 2, (kv * key_dim - 2) as i64);
            let q = b.sub(&k, &k);
            let heads = HeadShape {
                heads: kv,
                kv_heads: kv,
                qk_dim: key_dim,
                v_dim: value_dim,
            };
            attention_core(b, core, [&q, &k, &k], past, heads).1
        }
        CoreInputs::Reference { .. } => {
            let parts = b.unsqueeze(&parts, &[1]);
            let mut row = |width: usize| {
                let pads = b.const_i64(&[0, 0, 0, 0, 0, kv as i64 - 1, 0, width as i64 - 2]);
                b.op1("Pad", &[&parts, &pads], vec![])
            };
            let (key, value) = (row(key_dim), row(value_dim));
            let present = KvPair {
                key: b.concat(&[&past.key, &key], 2),
                value: b.concat(&[&past.value, &value], 2),
            };
            declare_present(b, &present, kv, [key_dim, value_dim]);
            present
        }
        CoreInputs::FixedCache { .. } => {
            panic!("the accelerator graphs take their token window as an input, not a history pair")
        }
    }
}
