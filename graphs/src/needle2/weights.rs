//! Dequantized float32 weights of one Needle 2 model, in the `.cact` layout (matrices
//! `[out, in]`). The hyper-connection and engram tensors are the shared blocks' types.

use crate::blocks::weights::{EngramWeights, MhcWeights, Tensor};

/// The 14 tensors of one `Block` (`layerNN.*` in the `.cact`).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[d_model]`, ZCRMSNorm_0 scale.
    pub norm_in: Tensor,
    /// `[num_heads * head_dim, d_model]`.
    pub q_proj: Tensor,
    /// `[num_kv_heads * head_dim, d_model]`.
    pub k_proj: Tensor,
    pub v_proj: Tensor,
    /// `[head_dim]`.
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    /// `[num_heads * head_dim, d_model]`, the sigmoid output gate.
    pub gate_proj: Tensor,
    /// `[d_model, num_heads * head_dim]`.
    pub out_proj: Tensor,
    /// `[d_model]`, post_attn_norm scale.
    pub post_norm: Tensor,
    /// `[1]`, pre-sigmoid residual gate.
    pub attn_gate: Tensor,
    /// `[d_model]`, pre_hada_norm scale.
    pub pre_hada: Tensor,
    /// `[hada_n]` each.
    pub d1: Tensor,
    pub d2: Tensor,
    pub d3: Tensor,
}

/// Every weight the graph needs.
#[derive(Clone, Debug)]
pub struct Weights {
    /// `[vocab, d_model]`, tied with the output projection.
    pub embedding: Tensor,
    pub layers: Vec<LayerWeights>,
    pub mhc: MhcWeights,
    pub engrams: Vec<EngramWeights>,
    /// `[d_model]`.
    pub final_norm: Tensor,
    /// The contrastive head, when the file has one (the `contrastive_embedding` output).
    pub contrastive: Option<ProbeHead>,
    /// The confidence head, when the file has one (the `confidence_logit` output).
    pub confidence: Option<ProbeHead>,
}

/// A probe head named by a code in `heads.manifest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadKind {
    /// Code 1: `contrastive_head`.
    Contrastive,
    /// Code 2: `confidence_head`.
    Confidence,
}

impl HeadKind {
    /// The upstream parameter name, the prefix of the head's tensors.
    pub fn name(self) -> &'static str {
        match self {
            HeadKind::Contrastive => "contrastive_head",
            HeadKind::Confidence => "confidence_head",
        }
    }
}

/// One probe head (upstream `ContrastiveHead` / `ConfidenceHead`): attention-pooling
/// probes and a linear projection of the pooled cells.
#[derive(Clone, Debug)]
pub struct ProbeHead {
    pub kind: HeadKind,
    /// `[P, d_model]`.
    pub probes: Tensor,
    /// `[out, P * d_model]`.
    pub proj: Tensor,
    /// `[out]`.
    pub bias: Tensor,
}
