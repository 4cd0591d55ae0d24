//! What one build of the graph is: the geometry, the variant, and the kernels the
//! variant implies, decided here once and passed to every model function (nothing
//! infers a variant from the opset).

use crate::builder::Opset;
use crate::contract::{AttentionKind, MatMulWeights, RuntimeTarget, Variant};
use crate::needle::Config;

/// Which single-kernel forms the graph uses instead of their ai.onnx expansions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    /// How the RMS norms are written.
    pub rms_normalization: RmsNorm,
    /// A `RotaryEmbedding` kernel instead of Slice/Mul/Concat.
    pub rotary_embedding: Option<RotaryKernel>,
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
        match (variant.attention, variant.runtime) {
            (AttentionKind::Fused(_), RuntimeTarget::Since1_24) => Kernels {
                rms_normalization: RmsNorm::Kernel,
                rotary_embedding: Some(RotaryKernel::Onnx),
            },
            (AttentionKind::Fused(_), RuntimeTarget::From1_20To1_23) => Kernels {
                rms_normalization: RmsNorm::FusedByOnnxruntime,
                rotary_embedding: Some(RotaryKernel::Contrib),
            },
            (AttentionKind::Reference, _) => Kernels {
                rms_normalization: RmsNorm::Expanded,
                rotary_embedding: None,
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
/// generation's config; the blocks both generations share read [`SharedGeometry`] only.
pub struct BuildContext<'a, C = Config> {
    pub cfg: &'a C,
    pub variant: Variant,
    pub kernels: Kernels,
    pub shared: SharedGeometry,
}

/// The geometry of the blocks Needle 2 and 3 share: the hyper-connection stream and
/// the engram memory.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedGeometry {
    pub d_model: usize,
    pub mhc_lanes: usize,
    pub engram: EngramGeometry,
}

/// The engram memory's geometry (see `engram.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct EngramGeometry {
    pub orders: Vec<usize>,
    /// `len(orders) * heads`.
    pub num_tables: usize,
    pub slots: usize,
    pub sub_dim: usize,
    pub conv_taps: usize,
    /// `max(orders)`.
    pub dilation: usize,
    /// Hash seeds of order `o`, head `h` are `SEED · (o·stride + h + 1)`: `heads` in
    /// Needle 2, `engram_seed_heads` (when set) in Needle 3.
    pub seed_stride: usize,
}

impl EngramGeometry {
    /// Tables per order.
    pub fn heads(&self) -> usize {
        self.num_tables / self.orders.len()
    }

    /// Tokens before the first new one that the n-grams and taps reach back.
    pub fn history(&self) -> usize {
        self.conv_taps * self.dilation
    }
}

/// A generation's config, as the shared blocks see it.
pub trait Geometry {
    fn shared(&self) -> SharedGeometry;
}

impl Geometry for Config {
    fn shared(&self) -> SharedGeometry {
        SharedGeometry {
            d_model: self.d_model,
            mhc_lanes: self.mhc_lanes,
            engram: EngramGeometry {
                orders: self.engram_orders.clone(),
                num_tables: self.num_engram_tables,
                slots: self.engram_slots,
                sub_dim: self.engram_sub_dim,
                conv_taps: self.engram_conv_taps,
                dilation: self.engram_conv_dilation,
                seed_stride: self.num_engram_tables / self.engram_orders.len(),
            },
        }
    }
}

impl<'a, C: Geometry> BuildContext<'a, C> {
    /// The context of one build of `variant` over `cfg`.
    pub fn new(cfg: &'a C, variant: Variant) -> Self {
        BuildContext {
            cfg,
            variant,
            kernels: Kernels::for_variant(variant),
            shared: cfg.shared(),
        }
    }
}

impl<C> BuildContext<'_, C> {
    /// Whether the large MatMuls are block-quantized, and how.
    pub fn matmul_weights(&self) -> MatMulWeights {
        self.variant.matmul_weights
    }
}
