//! `ZCRMSNorm` (`(1 + scale) · x / rms(x)`) and the unit RMS normalisation
//! `_rms_unit` (`x · rsqrt(mean(x²) + ε)`), both over the last axis: one
//! `RMSNormalization` node where the build context takes that kernel, its five-op
//! expansion elsewhere.

use crate::builder::{Attr, GraphBuilder, Value};
use crate::needle::BuildContext;

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
        let gain: Vec<f32> = scale.iter().map(|s| 1.0 + s).collect();
        let gain = b.weight("gain", &[gain.len()], &gain);
        if ctx.kernels.rms_normalization {
            return rms_normalization(b, x, &gain);
        }
        let rms = root_mean_square(b, x);
        let scaled = b.mul(&gain, x);
        b.div(&scaled, &rms)
    })
}

/// Needle `_rms_unit`: `x * rsqrt(mean(x²) + 1e-6)` over the last axis, `width` wide.
pub fn rms_unit<C>(b: &mut GraphBuilder, ctx: &BuildContext<C>, x: &Value, width: usize) -> Value {
    b.scope("rms_unit", |b| {
        if ctx.kernels.rms_normalization {
            // A scale as wide as the axis, not a broadcast scalar: onnxruntime's CUDA
            // kernel reads `width` scale values whatever the scale's shape (a scalar
            // gave garbage on an H200), and the CPU kernel is faster with it too.
            let ones = b.const_float(&[width], &vec![1.0; width]);
            return rms_normalization(b, x, &ones);
        }
        let rms = root_mean_square(b, x);
        let one = b.scalar_float(1.0);
        let inv = b.div(&one, &rms);
        b.mul(x, &inv)
    })
}

fn root_mean_square(b: &mut GraphBuilder, x: &Value) -> Value {
    let sq = b.mul(x, x);
    let mean = b.reduce_mean(&sq, &[-1]);
    let eps = b.scalar_float(EPSILON);
    let var = b.add(&mean, &eps);
    b.sqrt(&var)
}

fn rms_normalization(b: &mut GraphBuilder, x: &Value, scale: &Value) -> Value {
    let attrs = vec![("axis", Attr::Int(-1)), ("epsilon", Attr::Float(EPSILON))];
    b.op1("RMSNormalization", &[x, scale], attrs)
}
