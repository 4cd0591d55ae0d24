//! `ZCRMSNorm` (`(1 + scale) · x / rms(x)`) and the unit RMS normalisation
//! `_rms_unit` (`x · rsqrt(mean(x²) + ε)`), both over the last axis, in the form the
//! build context takes ([`RmsNorm`]).

use crate::blocks::context::{BuildContext, RmsNorm};
use crate::builder::{Attr, GraphBuilder, Value};

const EPSILON: f32 = 1e-6;

/// Needle `ZCRMSNorm`: `(1 + scale) * x / sqrt(mean(x²) + 1e-6)` over the last axis.
/// The initializer `<name>.gain` holds `1 + scale`, added in float32 before any
/// fp16 rounding (the same sum the graph would compute in fp32).
pub fn zc_rms_norm<C>(
    b: &mut GraphBuilder,
    ctx: &BuildContext<C>,
    x: &Value,
    name: &str,
    scale: &[f32],
) -> Value {
    b.scope(name, |b| {
        let gain = zc_gain(b, "gain", scale);
        match ctx.kernels.rms_normalization {
            RmsNorm::Kernel => rms_normalization(b, x, &gain),
            RmsNorm::FusedByOnnxruntime => fusable_rms_norm(b, x, &gain),
            RmsNorm::Expanded => {
                let rms = root_mean_square(b, x);
                let scaled = b.mul(&gain, x);
                b.div(&scaled, &rms)
            }
        }
    })
}

/// A `ZCRMSNorm` of `x` for the node that reads it: applied already (`Applied`), or left
/// to the reader (`Deferred`), which packed attention folds into its projection's node
/// (`needle.CqMatMul`'s `gain`) and anything else applies first ([`ZcNormed::value`]).
pub enum ZcNormed<'a> {
    Applied(Value),
    Deferred {
        x: &'a Value,
        name: &'static str,
        scale: &'a [f32],
    },
}

impl ZcNormed<'_> {
    /// The normed value, made here where the norm was deferred.
    pub fn value<C>(&self, b: &mut GraphBuilder, ctx: &BuildContext<C>) -> Value {
        match self {
            ZcNormed::Applied(h) => h.clone(),
            ZcNormed::Deferred { x, name, scale } => zc_rms_norm(b, ctx, x, name, scale),
        }
    }
}

/// A `ZCRMSNorm`'s gain `1 + scale` as initializer `name` (added in float32, before any
/// fp16 rounding): what the norm multiplies by, and what the Needle ops that fuse a norm
/// read.
pub fn zc_gain(b: &mut GraphBuilder, name: &str, scale: &[f32]) -> Value {
    let gain: Vec<f32> = scale.iter().map(|s| 1.0 + s).collect();
    b.weight(name, &[gain.len()], &gain)
}

/// Needle `_rms_unit`: `x * rsqrt(mean(x²) + 1e-6)` over the last axis, `width` wide.
pub fn rms_unit<C>(b: &mut GraphBuilder, ctx: &BuildContext<C>, x: &Value, width: usize) -> Value {
    b.scope("rms_unit", |b| {
        // A scale as wide as the axis, not a broadcast scalar: onnxruntime's CUDA
        // kernel reads `width` scale values whatever the scale's shape (a scalar
        // gave garbage on an H200), and the CPU kernel is faster with it too.
        let ones = |b: &mut GraphBuilder| b.const_float(&[width], &vec![1.0; width]);
        match ctx.kernels.rms_normalization {
            RmsNorm::Kernel => {
                let ones = ones(b);
                rms_normalization(b, x, &ones)
            }
            RmsNorm::FusedByOnnxruntime => {
                let ones = ones(b);
                fusable_rms_norm(b, x, &ones)
            }
            RmsNorm::Expanded => {
                let rms = root_mean_square(b, x);
                let one = b.scalar_float(1.0);
                let inv = b.div(&one, &rms);
                b.mul(x, &inv)
            }
        }
    })
}

fn root_mean_square(b: &mut GraphBuilder, x: &Value) -> Value {
    let sq = b.mul(x, x);
    let mean = b.reduce_mean(&sq, &[-1]);
    let eps = b.scalar_float(EPSILON);
    let var = b.add(&mean, &eps);
    b.sqrt(&var)
}

/// `x / sqrt(mean(x²) + ε) · scale` as onnxruntime's `SimplifiedLayerNormFusion` matches
/// it: `Pow` by 2 (a `Mul` of `x` by itself is not matched), the division by the root, then
/// the scale.
fn fusable_rms_norm(b: &mut GraphBuilder, x: &Value, scale: &Value) -> Value {
    let two = b.scalar_float(2.0);
    let sq = b.op1("Pow", &[x, &two], vec![]);
    let mean = b.reduce_mean(&sq, &[-1]);
    let eps = b.scalar_float(EPSILON);
    let var = b.add(&mean, &eps);
    let rms = b.sqrt(&var);
    let normalized = b.div(x, &rms);
    b.mul(&normalized, scale)
}

fn rms_normalization(b: &mut GraphBuilder, x: &Value, scale: &Value) -> Value {
    let attrs = vec![("axis", Attr::Int(-1)), ("epsilon", Attr::Float(EPSILON))];
    b.op1("RMSNormalization", &[x, scale], attrs)
}
