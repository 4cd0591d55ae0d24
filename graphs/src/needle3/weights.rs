//! Dequantized float32 weights of one Needle 3 model, in the `.cact` layout (matrices
//! `[out, in]`). The hyper-connection and engram tensors have Needle 2's shapes and types.

use crate::blocks::weights::{EngramWeights, MhcWeights, Tensor};

/// The depthwise conv taps over the raw projections, `[taps, width]` each; tap `j`
/// weighs the projection `j` positions back.
#[derive(Clone, Debug)]
pub struct QkvTaps {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
}

/// The Monarch MLP of one layer (upstream `HadamardMLP`, 3.2.8).
#[derive(Clone, Debug)]
pub struct MonarchWeights {
    /// `[hada_n]` each: input, pre-activation, middle and output diagonals, and the bias.
    pub d1: Tensor,
    pub d2: Tensor,
    pub b2: Tensor,
    pub d3: Tensor,
    pub d4: Tensor,
    /// The three stages' Kronecker factors, `[a, a]` and `[b, b]`, `a * b = hada_n`.
    pub w1a: Tensor,
    pub w1b: Tensor,
    pub w2a: Tensor,
    pub w2b: Tensor,
    pub w3a: Tensor,
    pub w3b: Tensor,
    /// `[d_model, rank]` and `[rank, hada_n]`: the conditioning `1 + softmax(x·v)·u`.
    pub cond_v: Tensor,
    pub cond_u: Tensor,
}

/// One `Block` (`layerNN.*`).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[d_model]`, ZCRMSNorm_0 scale.
    pub norm_in: Tensor,
    /// `[num_heads * qk_head_dim, d_model]`.
    pub q_proj: Tensor,
    /// `[num_kv_heads * qk_head_dim, d_model]`.
    pub k_proj: Tensor,
    /// `[num_kv_heads * v_head_dim, d_model]`.
    pub v_proj: Tensor,
    /// Present when `qkv_conv_taps > 0`.
    pub qkv_taps: Option<QkvTaps>,
    /// `[qk_head_dim]`.
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    /// `[num_heads * v_head_dim, d_model]`, the sigmoid output gate.
    pub gate_proj: Tensor,
    /// `[d_model, num_heads * v_head_dim]`.
    pub out_proj: Tensor,
    /// `[d_model]`, post_attn_norm scale.
    pub post_norm: Tensor,
    /// `[1]`, pre-sigmoid residual gate.
    pub attn_gate: Tensor,
    /// `[d_model]`, pre_hada_norm scale.
    pub pre_hada: Tensor,
    pub mlp: MonarchWeights,
}

/// Every weight of the logits graph.
#[derive(Clone, Debug)]
pub struct Weights {
    /// `[vocab, d_model]`; its first `out_vocab` rows are the output head.
    pub embedding: Tensor,
    pub layers: Vec<LayerWeights>,
    pub mhc: MhcWeights,
    /// The Monarch MLP's two permutations of `0..hada_n`, shared by every layer.
    pub hada_p1: Vec<i64>,
    pub hada_p2: Vec<i64>,
    pub engrams: Vec<EngramWeights>,
    /// `[d_model]`.
    pub final_norm: Tensor,
    /// The confidence head, when the file has one (the other heads are not exported).
    pub confidence: Option<ProbeHead>,
}

/// A probe head named by a code in `heads.manifest` (upstream `HEADS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadKind {
    /// Code 1: `embedding_head`, a unit-norm query embedding.
    Embedding,
    /// Code 2: `confidence_head`, one logit: will this answer be right?
    Confidence,
    /// Code 3: `router_head`, three logits, with a calibration vector.
    Router,
}

impl HeadKind {
    /// Every kind, in the canonical (manifest) order.
    pub const ALL: [HeadKind; 3] = [HeadKind::Embedding, HeadKind::Confidence, HeadKind::Router];

    /// The manifest code.
    pub fn code(self) -> u32 {
        match self {
            HeadKind::Embedding => 1,
            HeadKind::Confidence => 2,
            HeadKind::Router => 3,
        }
    }

    /// The upstream parameter name, the prefix of the head's tensors.
    pub fn name(self) -> &'static str {
        match self {
            HeadKind::Embedding => "embedding_head",
            HeadKind::Confidence => "confidence_head",
            HeadKind::Router => "router_head",
        }
    }

    /// Width of the head's output, where upstream fixes it (the embedding's is the file's).
    pub fn fixed_outputs(self) -> Option<usize> {
        match self {
            HeadKind::Embedding => None,
            HeadKind::Confidence => Some(1),
            HeadKind::Router => Some(3),
        }
    }
}

/// One probe head (upstream `ProbeHead.pooled` + `HeadProjection`): `k` probes per
/// row attention-pool each row of the hidden cells (the scaled embedding, then every
/// block's lane mean), `q` queries pool the pooled rows, a linear map makes the output.
#[derive(Clone, Debug)]
pub struct ProbeHead {
    pub kind: HeadKind,
    /// `[rows, k, d_model]`, rows = `num_layers + 1`.
    pub probes: Tensor,
    /// `[rows, k]`.
    pub gain: Tensor,
    /// `[q, d_model]`.
    pub query: Tensor,
    /// `[q, rows, k]`.
    pub row_bias: Tensor,
    /// `[outputs, q * d_model]`.
    pub proj: Tensor,
    /// `[outputs]`.
    pub bias: Tensor,
    /// `[3]`, the router's only.
    pub calibration: Option<Tensor>,
}
