//! What one build of the graph is: the geometry, the variant, and the kernels the
//! variant implies, decided here once and passed to every model function (nothing
//! infers a variant from the opset).

use crate::builder::Opset;
use crate::contract::{AttentionKind, MatMulWeights, Variant};
use crate::needle::Config;

/// Which single-kernel forms the graph uses instead of their ai.onnx expansions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    /// Opset-23 `RMSNormalization` instead of Mul/ReduceMean/Add/Sqrt/Div.
    pub rms_normalization: bool,
    /// Opset-23 `RotaryEmbedding` instead of Slice/Mul/Concat.
    pub rotary_embedding: bool,
}

impl Kernels {
    /// The fused variant is onnxruntime's fast path, so it takes every single kernel; the
    /// reference variant stays on opset-21 primitives that any runtime and execution
    /// provider takes.
    pub fn for_attention(attention: AttentionKind) -> Self {
        match attention {
            AttentionKind::Fused(_) => Kernels {
                rms_normalization: true,
                rotary_embedding: true,
            },
            AttentionKind::Reference => Kernels {
                rms_normalization: false,
                rotary_embedding: false,
            },
        }
    }

    /// The lowest ai.onnx opset that has these kernels.
    pub fn opset(self) -> Opset {
        if self.rms_normalization || self.rotary_embedding {
            Opset::V23
        } else {
            Opset::V21
        }
    }
}

/// Everything the model functions need besides the builder and the weights.
pub struct BuildContext<'a> {
    pub cfg: &'a Config,
    pub variant: Variant,
    pub kernels: Kernels,
}

impl<'a> BuildContext<'a> {
    /// The context of one build of `variant` over `cfg`.
    pub fn new(cfg: &'a Config, variant: Variant) -> Self {
        BuildContext {
            cfg,
            variant,
            kernels: Kernels::for_attention(variant.attention),
        }
    }

    /// Whether the large MatMuls are block-quantized, and how.
    pub fn matmul_weights(&self) -> MatMulWeights {
        self.variant.matmul_weights
    }
}
