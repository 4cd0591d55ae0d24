//! `SimpleAttentionNetwork.__call__` with a KV cache, from `input_ids` to `logits`:
//!
//! ```text
//! input_ids ─Gather(embedding)·√d─ Expand(n lanes) ─┬─ layer 0 … layer L−1 ─ mean(lanes) ─ final_norm ─ ·embeddingᵀ ─▶ logits
//!                                                    │   hc_pre → [engram] → block → hc_post
//! past_input_ids ++ input_ids ─ engram hash ─────────┘ (engram sites only)
//! ```

use crate::builder::{Dim, GraphBuilder, MatMulWeights, Opset, Precision, Value};
use crate::needle::attention::{attention, AttentionCtx, AttentionKind, CoreInputs, KvPair, Rope};
use crate::needle::block_quant::{gather_table, matmul_nbits};
use crate::needle::engram::{self, EngramKv, EngramWindow};
use crate::needle::hadamard_mlp::hadamard_mlp;
use crate::needle::hyper_connections::{hc_post, hc_pre};
use crate::needle::norms::zc_rms_norm;
use crate::needle::{Config, LayerWeights, Weights};
use crate::onnx::{data_type, ModelProto};

/// Graph input holding the token history the engram n-grams need between steps.
pub const PAST_INPUT_IDS: &str = "past_input_ids";
/// Graph output: `past_input_ids ++ input_ids`, fed back as the next `past_input_ids`.
pub const PRESENT_INPUT_IDS: &str = "present_input_ids";

/// Names of the cache inputs/outputs of layer `i`.
pub fn kv_names(i: usize) -> [String; 4] {
    [
        format!("past_key_values.{i}.key"),
        format!("past_key_values.{i}.value"),
        format!("present.{i}.key"),
        format!("present.{i}.value"),
    ]
}

/// The `present.*` output that carries a `past_key_values.*` input forward; `None` for
/// other inputs.
pub fn present_name(past: &str) -> Option<String> {
    past.strip_prefix("past_key_values.")
        .map(|rest| format!("present.{rest}"))
}

/// Builds the whole model graph. `metadata` goes into `metadata_props` as given.
/// The fused variant is onnxruntime's fast path (opset 23 `RMSNormalization`,
/// `GroupQueryAttention`); the reference variant stays on opset 21 primitives so
/// that any runtime and execution provider takes all of it.
pub fn build(
    cfg: &Config,
    w: &Weights,
    kind: AttentionKind,
    precision: Precision,
    matmul_weights: MatMulWeights,
    metadata: Vec<(String, String)>,
) -> ModelProto {
    let opset = match kind {
        AttentionKind::Fused => Opset::V23,
        AttentionKind::Reference => Opset::V21,
    };
    let mut b = GraphBuilder::new(opset, precision, matmul_weights);
    let float = precision.data_type();
    let input_ids = b.input(
        "input_ids",
        data_type::INT64,
        &[Dim::Named("batch"), Dim::Named("sequence")],
    );
    let mask = b.input(
        "attention_mask",
        data_type::INT64,
        &[Dim::Named("batch"), Dim::Named("total_sequence")],
    );
    let cache_dims = |len| {
        [
            Dim::Named("batch"),
            Dim::Fixed(cfg.num_kv_heads),
            Dim::Named(len),
            Dim::Fixed(cfg.head_dim),
        ]
    };
    let pasts: Vec<KvPair> = (0..cfg.num_layers)
        .map(|i| {
            let [k, v, _, _] = kv_names(i);
            KvPair {
                key: b.input(&k, float, &cache_dims("past_sequence")),
                value: b.input(&v, float, &cache_dims("past_sequence")),
            }
        })
        .collect();
    let past_ids = b.input(
        PAST_INPUT_IDS,
        data_type::INT64,
        &[Dim::Named("batch"), Dim::Named("past_sequence")],
    );

    // The mask, not the cache, says how many tokens came before: a caller may pass a
    // preallocated cache longer than that which the fused graph's attention updates in
    // place (`past_present_share_buffer`).
    let past_len = b.scope("past_len", |b| {
        let total = b.shape_of(&mask, 1, 2);
        let seq = b.shape_of(&input_ids, 1, 2);
        b.sub(&total, &seq)
    });
    let ctx = b.scope("attn_ctx", |b| {
        attention_ctx(b, cfg, kind, &input_ids, &mask, &past_len)
    });
    let all_ids = b.scope("engram_history", |b| b.concat(&[&past_ids, &input_ids], 1));
    b.declare(
        &all_ids,
        data_type::INT64,
        &[Dim::Named("batch"), Dim::Named("total_sequence")],
    );
    let engram_kv = engrams(&mut b, cfg, w, &all_ids, &mask, &past_len);

    let x = b.scope("embed_tokens", |b| {
        // The float table is shared with the lm_head (tied); compact weights quantize
        // each use in its own layout.
        let emb = matches!(b.matmul_weights(), MatMulWeights::Float)
            .then(|| b.weight("embedding", &w.embedding.shape, &w.embedding.data));
        let x = match &emb {
            Some(emb) => b.gather(emb, &input_ids, 0),
            None => gather_table(b, "embedding", &w.embedding, &input_ids),
        };
        let scale = b.scalar_float((cfg.d_model as f64).sqrt() as f32);
        let x = b.mul(&x, &scale);
        let x = b.unsqueeze(&x, &[2]);
        let lanes = b.const_i64(&[1, 1, cfg.mhc_lanes as i64, 1]);
        (emb, b.op1("Expand", &[&x, &lanes], vec![]))
    });
    let (embedding, mut x) = x;

    let mut presents = Vec::new();
    for (i, lw) in w.layers.iter().enumerate() {
        b.scope(format!("layers.{i}"), |b| {
            let (u, mix) = hc_pre(b, &x, &w.mhc, i, cfg);
            let site = cfg.engram_sites.iter().position(|&s| s == i);
            let bx = match site {
                Some(s) => b.scope(format!("engrams.{s}"), |b| {
                    engram::inject(b, &u, &engram_kv[s], cfg.d_model)
                }),
                None => u.clone(),
            };
            let (out, present) = block(b, &bx, lw, &pasts[i], cfg, &ctx);
            let y = b.sub(&out, &u);
            x = hc_post(b, &x, &y, &mix, cfg);
            presents.push(present);
        });
    }

    let logits = b.scope("lm_head", |b| {
        let x = b.reduce_mean(&x, &[2]);
        let x = b.squeeze(&x, &[2]);
        let x = zc_rms_norm(b, &x, "final_norm", &w.final_norm.data);
        let logits = match &embedding {
            Some(embedding) => {
                let et = b.transpose(embedding, &[1, 0]);
                b.matmul(&x, &et)
            }
            None => b.scope("embedding", |b| {
                matmul_nbits(b, &x, &w.embedding.data, cfg.vocab, cfg.d_model)
            }),
        };
        match precision {
            Precision::Fp32 => logits,
            Precision::Fp16 => b.cast(&logits, data_type::FLOAT),
        }
    });

    b.output(
        &logits,
        "logits",
        data_type::FLOAT,
        &[
            Dim::Named("batch"),
            Dim::Named("sequence"),
            Dim::Fixed(cfg.vocab),
        ],
    );
    for (i, p) in presents.iter().enumerate() {
        let [_, _, k, v] = kv_names(i);
        b.output(&p.key, &k, float, &cache_dims("total_sequence"));
        b.output(&p.value, &v, float, &cache_dims("total_sequence"));
    }
    b.output(
        &all_ids,
        PRESENT_INPUT_IDS,
        data_type::INT64,
        &[Dim::Named("batch"), Dim::Named("total_sequence")],
    );
    b.finish("needle", metadata)
}

/// Needle `Block`: `x + σ(attn_gate)·post_norm(attn(norm_in x))`, then
/// `+ hadamard_mlp(pre_hada x)`.
fn block(
    b: &mut GraphBuilder,
    x: &Value,
    w: &LayerWeights,
    past: &KvPair,
    cfg: &Config,
    ctx: &AttentionCtx,
) -> (Value, KvPair) {
    let h = zc_rms_norm(b, x, "norm_in", &w.norm_in.data);
    let (h, kv) = b.scope("self_attn", |b| attention(b, &h, w, past, cfg, ctx));
    let h = zc_rms_norm(b, &h, "post_attn_norm", &w.post_norm.data);
    let gate = sigmoid(w.attn_gate.data[0]);
    let gate = b.weight("attn_gate_sigmoid", &[1], &[gate]);
    let h = b.mul(&gate, &h);
    let x = b.add(x, &h);
    let h = zc_rms_norm(b, &x, "pre_hada_norm", &w.pre_hada.data);
    let h = b.scope("hadamard_mlp", |b| hadamard_mlp(b, &h, w, cfg.d_model));
    (b.add(&x, &h), kv)
}

/// `1 / (1 + e^-x)` in float32, as XLA's sigmoid of a float32 scalar.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// RoPE tables for the new positions and the core's mask inputs, built once.
fn attention_ctx(
    b: &mut GraphBuilder,
    cfg: &Config,
    kind: AttentionKind,
    input_ids: &Value,
    mask: &Value,
    past_len: &Value,
) -> AttentionCtx {
    let seq_len = b.shape_of(input_ids, 1, 2);
    let total_len = b.add(past_len, &seq_len);
    let start = b.squeeze(past_len, &[0]);
    let end = b.squeeze(&total_len, &[0]);
    let one = b.scalar_i64(1);
    let positions = b.op1("Range", &[&start, &end, &one], vec![]);
    b.declare(&positions, data_type::INT64, &[Dim::Named("sequence")]);
    let (cos_table, sin_table) = rope_tables(cfg);
    let half = cfg.head_dim / 2;
    let cos = b.const_float(&[cfg.max_seq_len, half], &cos_table);
    let sin = b.const_float(&[cfg.max_seq_len, half], &sin_table);
    let rope = if b.opset() >= Opset::V23 {
        let row = b.unsqueeze(&positions, &[0]);
        let batch_seq = b.shape_of(input_ids, 0, 2);
        let position_ids = b.op1("Expand", &[&row, &batch_seq], vec![]);
        b.declare(
            &position_ids,
            data_type::INT64,
            &[Dim::Named("batch"), Dim::Named("sequence")],
        );
        Rope::Kernel {
            cos_cache: cos,
            sin_cache: sin,
            position_ids,
        }
    } else {
        let cos = b.gather(&cos, &positions, 0);
        let sin = b.gather(&sin, &positions, 0);
        Rope::Expanded {
            cos: b.unsqueeze(&cos, &[1]),
            sin: b.unsqueeze(&sin, &[1]),
        }
    };
    let window = effective_window(cfg);
    let core = match kind {
        AttentionKind::Fused => {
            let valid = b.reduce_sum(mask, &[1], false);
            let last = b.sub(&valid, &one);
            let seqlens_k = b.cast(&last, data_type::INT32);
            let total = b.cast(&end, data_type::INT32);
            CoreInputs::Fused {
                seqlens_k,
                total_len: total,
                local_window: window,
            }
        }
        AttentionKind::Reference => {
            let zero = b.scalar_i64(0);
            let keys = b.op1("Range", &[&zero, &end, &one], vec![]);
            b.declare(&keys, data_type::INT64, &[Dim::Named("total_sequence")]);
            let k_row = b.unsqueeze(&keys, &[0]);
            let q_col = b.unsqueeze(&positions, &[1]);
            let mut visible = b.op1("LessOrEqual", &[&k_row, &q_col], vec![]);
            if let Some(w) = window {
                let distance = b.sub(&q_col, &k_row);
                let limit = b.scalar_i64(w as i64);
                let recent = b.op1("Less", &[&distance, &limit], vec![]);
                visible = b.op1("And", &[&visible, &recent], vec![]);
            }
            let key_valid = b.cast(mask, data_type::BOOL);
            let key_valid = b.unsqueeze(&key_valid, &[1, 2, 3]);
            let visible = b.op1("And", &[&visible, &key_valid], vec![]);
            let dims = [
                Dim::Named("batch"),
                Dim::Fixed(1),
                Dim::Fixed(1),
                Dim::Named("sequence"),
                Dim::Named("total_sequence"),
            ];
            b.declare(&visible, data_type::BOOL, &dims);
            CoreInputs::Reference { visible }
        }
    };
    AttentionCtx { rope, core }
}

/// The sliding window when it can bind (shorter than `max_seq_len`).
fn effective_window(cfg: &Config) -> Option<usize> {
    (cfg.kv_window > 0 && cfg.kv_window < cfg.max_seq_len).then_some(cfg.kv_window)
}

/// `cos`/`sin` of `t · inv_freq` for `t < max_seq_len`, `[max_seq_len, head_dim/2]`,
/// with upstream's float32 steps: `inv_freq = 1 / θ^(2i/hd)`, angle `f32(t) · inv_freq`.
pub fn rope_tables(cfg: &Config) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| {
            let exponent = (2 * i) as f32 / cfg.head_dim as f32;
            1.0f32 / ((cfg.rope_theta as f64).powf(exponent as f64) as f32)
        })
        .collect();
    let mut cos = Vec::with_capacity(cfg.max_seq_len * half);
    let mut sin = Vec::with_capacity(cfg.max_seq_len * half);
    for t in 0..cfg.max_seq_len {
        for f in &inv_freq {
            let angle = (t as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Keys and values of every engram site for the new positions; `all_ids` is
/// `past_input_ids ++ input_ids`.
fn engrams(
    b: &mut GraphBuilder,
    cfg: &Config,
    w: &Weights,
    all_ids: &Value,
    mask: &Value,
    past_len: &Value,
) -> Vec<EngramKv> {
    if cfg.engram_sites.is_empty() {
        return Vec::new();
    }
    let history = engram::history_len(cfg) as i64;
    let window = b.scope("engram_window", |b| {
        let ids = b.pad_front(all_ids, 2, 1, history);
        let ids = b.slice_from(&ids, 1, past_len);
        let valid = b.pad_front(mask, 2, 1, history);
        let valid = b.slice_from(&valid, 1, past_len);
        let valid = b.cast(&valid, b.precision().data_type());
        b.declare(&ids, data_type::INT64, &engram::WINDOW_DIMS);
        b.declare(&valid, b.precision().data_type(), &engram::WINDOW_DIMS);
        EngramWindow { ids, valid }
    });
    let rows = engram::hashed_rows(b, &window.ids, cfg);
    w.engrams
        .iter()
        .enumerate()
        .map(|(s, ew)| {
            b.scope(format!("engrams.{s}"), |b| {
                engram::engram(b, &window, &rows, ew, cfg)
            })
        })
        .collect()
}
