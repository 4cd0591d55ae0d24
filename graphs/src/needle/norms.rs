//! `ZCRMSNorm` (`(1 + scale) · x / rms(x)`) and the unit RMS normalisation
//! `_rms_unit` (`x · rsqrt(mean(x²) + ε)`), both over the last axis.

use crate::builder::{GraphBuilder, Value};

const EPSILON: f32 = 1e-6;

/// Needle `ZCRMSNorm`: `(1 + scale) * x / sqrt(mean(x²) + 1e-6)` over the last axis.
pub fn zc_rms_norm(b: &mut GraphBuilder, x: &Value, name: &str, scale: &[f32]) -> Value {
    b.scope(name, |b| {
        let scale = b.weight("scale", &[scale.len()], scale);
        let one = b.scalar_float(1.0);
        let gain = b.add(&one, &scale);
        let rms = root_mean_square(b, x);
        let scaled = b.mul(&gain, x);
        b.div(&scaled, &rms)
    })
}

/// Needle `_rms_unit`: `x * rsqrt(mean(x²) + 1e-6)` over the last axis.
pub fn rms_unit(b: &mut GraphBuilder, x: &Value) -> Value {
    b.scope("rms_unit", |b| {
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
