//! What one build of the graph is: the geometry, the variant, and the kernels the
//! variant implies, decided here once and passed to every model function (nothing
//! infers a variant from the opset).

use crate::builder::Opset;
use crate::contract::{AttentionKind, MatMulWeights, RuntimeTarget, Variant};
use crate::geometry::{CommonGeometry, Geometry};

/// Which single-kernel forms the graph uses instead of their ai.onnx expansions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    /// How the RMS norms are written.
    pub rms_normalization: RmsNorm,
    /// A `RotaryEmbedding` kernel instead of Slice/Mul/Concat.
    pub rotary_embedding: Option<RotaryKernel>,
    /// The Needle op domain's fused kernels (the Sinkhorn mix) instead of their stock
    /// expansions: only where the graph needs the Needle kernels anyway (packed weights),
    /// so stock graphs stay stock.
    pub needle_ops: bool,
    /// Which ops the blocks write their steps in.
    pub op_forms: OpForms,
}

/// The ops the blocks write the Sinkhorn, zero padding, lane broadcast and sums in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpForms {
    /// The stock graphs' (`LogSoftmax`, `Pad`, `Expand`, `ReduceSum`).
    Onnx,
    /// Only ops that onnxruntime's CoreML (MLProgram) and NNAPI execution providers both
    /// take (Softmax/ReduceMean/Div, MatMul, Slice/Concat, Mul), so that the accelerator
    /// graphs (`crate::accelerator`) stay one partition.
    MobileAccelerators,
}

/// How an RMS normalisation is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmsNorm {
    /// Opset-23 `RMSNormalization`.
    Kernel,
    /// `gain · x / sqrt(mean(x · x) + ε)` in plain primitives.
    Expanded,
    /// `x / sqrt(mean(x²) + ε) · gain` with `Pow`, the nodes onnxruntime's
    /// `SimplifiedLayerNormFusion` matches (1.20 on): opset-21 primitives that its session
    /// runs as one RMS kernel.
    FusedByOnnxruntime,
}

/// Which `RotaryEmbedding` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotaryKernel {
    /// Opset 23's.
    Onnx,
    /// `com.microsoft.RotaryEmbedding`, onnxruntime's contrib op that opset 23's was made
    /// from (in onnxruntime 1.20 already; inputs in another order).
    Contrib,
}

impl Kernels {
    /// The fused variant is onnxruntime's fast path, so it takes every single kernel its
    /// runtime target has. Before 1.23 RoPE has its contrib kernel; the RMS kernel there
    /// (`SimplifiedLayerNormalization`) claims the ai.onnx domain, which `onnx.checker`
    /// refuses, so the norms are written in the form onnxruntime fuses into it. The
    /// reference variant stays on opset-21 primitives that any runtime and execution
    /// provider takes.
    pub fn for_variant(variant: Variant) -> Self {
        let needle_ops = variant.matmul_weights == MatMulWeights::Packed;
        match (variant.attention, variant.runtime) {
            (AttentionKind::Fused(_), RuntimeTarget::Since1_24) => Kernels {
                rms_normalization: RmsNorm::Kernel,
                rotary_embedding: Some(RotaryKernel::Onnx),
                needle_ops,
                op_forms: OpForms::Onnx,
            },
            (AttentionKind::Fused(_), RuntimeTarget::From1_20To1_23) => Kernels {
                rms_normalization: RmsNorm::FusedByOnnxruntime,
                rotary_embedding: Some(RotaryKernel::Contrib),
                needle_ops,
                op_forms: OpForms::Onnx,
            },
            (AttentionKind::Reference, _) => Kernels {
                rms_normalization: RmsNorm::Expanded,
                rotary_embedding: None,
                needle_ops,
                op_forms: OpForms::Onnx,
            },
        }
    }

    /// The lowest ai.onnx opset that has these kernels.
    pub fn opset(self) -> Opset {
        if self.rms_normalization == RmsNorm::Kernel
            || self.rotary_embedding == Some(RotaryKernel::Onnx)
        {
            Opset::V23
        } else {
            Opset::V21
        }
    }
}

/// Everything the model functions need besides the builder and the weights. `C` is the
/// generation's config; the shared blocks read only its [`CommonGeometry`].
pub struct BuildContext<'a, C> {
    pub cfg: &'a C,
    pub common: &'a CommonGeometry,
    pub variant: Variant,
    pub kernels: Kernels,
}

impl<'a, C: Geometry> BuildContext<'a, C> {
    /// The context of one build of `variant` over `cfg`.
    pub fn new(cfg: &'a C, variant: Variant) -> Self {
        BuildContext {
            cfg,
            common: cfg.common(),
            variant,
            kernels: Kernels::for_variant(variant),
        }
    }
}

impl<C> BuildContext<'_, C> {
    /// Whether the large MatMuls are block-quantized, and how.
    pub fn matmul_weights(&self) -> MatMulWeights {
        self.variant.matmul_weights
    }
}
