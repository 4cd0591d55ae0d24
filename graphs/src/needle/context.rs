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
            kernels: Kernels::for_attention(variant.attention),
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
