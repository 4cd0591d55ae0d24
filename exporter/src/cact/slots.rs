//! The positional tensor order (upstream `export._tensors`) with the name and
//! shape the header geometry implies for each index.

use super::directory::Slot;
use super::header::Header;
use super::CactError;

/// Per-layer tensors, in file order.
pub const LAYER_TENSORS: [&str; 14] = [
    "norm_in",
    "q_proj",
    "k_proj",
    "v_proj",
    "q_norm",
    "k_norm",
    "gate_proj",
    "out_proj",
    "post_norm",
    "attn_gate",
    "pre_hada",
    "d1",
    "d2",
    "d3",
];

/// The nine hyper-connection tensors, in file order.
pub const MHC_TENSORS: [&str; 9] = [
    "mhc_a_pre",
    "mhc_a_post",
    "mhc_a_res",
    "mhc_b_pre",
    "mhc_b_post",
    "mhc_b_res",
    "mhc_phi_pre",
    "mhc_phi_post",
    "mhc_phi_res",
];

/// Per-engram-site tensors, in file order.
pub const ENGRAM_TENSORS: [&str; 4] = ["tables", "key_proj", "value_proj", "taps"];

/// Upstream name of a per-layer tensor, e.g. `layer03.k_proj`.
pub fn layer_name(layer: usize, tensor: &str) -> String {
    format!("layer{layer:02}.{tensor}")
}

/// Upstream name of a per-site engram tensor, e.g. `engram1.taps`.
pub fn engram_name(site: usize, tensor: &str) -> String {
    format!("engram{site}.{tensor}")
}

/// Number of tensors from `embedding` through `final_norm`.
pub(crate) fn core_count(h: &Header) -> u64 {
    1 + 14 * h.num_layers as u64 + 9 + 4 * h.engram_sites.len() as u64 + 1
}

/// Slots from `embedding` through `final_norm`; call only once `num_tensors`
/// is known to fit in the file, since this allocates [`core_count`] slots.
pub(crate) fn core_slots(h: &Header) -> Result<Vec<Slot>, CactError> {
    let [vocab, d, heads, kv_heads, layers, hd, hada, lanes] = [
        h.vocab,
        h.d_model,
        h.num_heads,
        h.num_kv_heads,
        h.num_layers,
        h.head_dim,
        h.hada_n,
        h.mhc_lanes,
    ]
    .map(u64::from);
    let [tables, slots, sub, taps] = [
        h.num_engram_tables,
        h.engram_slots,
        h.engram_sub_dim,
        h.engram_conv_taps,
    ]
    .map(u64::from);
    let q_rows = heads * hd;
    let kv_rows = kv_heads * hd;
    let lane_cols = lanes * d;
    let res_rows = (layers * lanes)
        .checked_mul(lanes)
        .ok_or_else(|| CactError::Header {
            field: "mhc_lanes",
            offset: 52,
            value: h.mhc_lanes.to_string(),
            expected: "small enough that num_layers * mhc_lanes^2 fits in 64 bits".to_string(),
        })?;

    let mut out = Vec::with_capacity(core_count(h) as usize);
    out.push(Slot::float("embedding", &[vocab, d]));
    for layer in 0..layers as usize {
        let shapes: [&[u64]; 14] = [
            &[d],
            &[q_rows, d],
            &[kv_rows, d],
            &[kv_rows, d],
            &[hd],
            &[hd],
            &[q_rows, d],
            &[d, q_rows],
            &[d],
            &[1],
            &[d],
            &[hada],
            &[hada],
            &[hada],
        ];
        for (tensor, shape) in LAYER_TENSORS.iter().zip(shapes) {
            out.push(Slot::float(layer_name(layer, tensor), shape));
        }
    }
    let mhc_shapes: [&[u64]; 9] = [
        &[layers],
        &[layers],
        &[layers],
        &[layers, lanes],
        &[layers, lanes],
        &[layers, lanes, lanes],
        &[layers * lanes, lane_cols],
        &[layers * lanes, lane_cols],
        &[res_rows, lane_cols],
    ];
    for (name, shape) in MHC_TENSORS.iter().zip(mhc_shapes) {
        out.push(Slot::float(*name, shape));
    }
    for site in 0..h.engram_sites.len() {
        let shapes: [&[u64]; 4] = [
            &[tables * slots, sub],
            &[d, tables * sub],
            &[d, tables * sub],
            &[taps, d],
        ];
        for (tensor, shape) in ENGRAM_TENSORS.iter().zip(shapes) {
            out.push(Slot::float(engram_name(site, tensor), shape));
        }
    }
    out.push(Slot::float("final_norm", &[d]));
    Ok(out)
}
