//! Command-line values shared by `needle-export` and `needle-run`.

use clap::ValueEnum;
use graphs::builder::{MatMulWeights, Precision};

/// `--precision`: float precision of weights and activations (logits stay float32).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PrecisionArg {
    Fp32,
    Fp16,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Fp16 => Precision::Fp16,
        }
    }
}

/// `--weights`: `float` is the exact model; `int8`/`int4` re-quantize the large
/// MatMuls into `com.microsoft.MatMulNBits` blocks (smaller, faster, approximate).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum WeightsArg {
    Float,
    Int8,
    Int4,
}

impl From<WeightsArg> for MatMulWeights {
    fn from(w: WeightsArg) -> Self {
        match w {
            WeightsArg::Float => MatMulWeights::Float,
            WeightsArg::Int8 => MatMulWeights::Int8,
            WeightsArg::Int4 => MatMulWeights::Int4,
        }
    }
}
