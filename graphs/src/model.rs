//! The one place a graph build picks its generation's model tree.

use crate::config::ModelConfig;
use crate::description::ExportDescription;
use crate::onnx::ModelProto;
use crate::{needle2, needle3, stream};

/// A model's dequantized weights, whatever its generation.
#[derive(Clone, Debug)]
pub enum ModelWeights {
    Needle2(Box<needle2::Weights>),
    Needle3(Box<needle3::Weights>),
}

impl ModelWeights {
    /// The confidence head's running pools, which graphs with the Needle ops carry
    /// between calls: Needle 2's a probe, Needle 3's a probe of each of its `layers + 1`
    /// rows. `None` without the head.
    pub fn confidence_pools(&self) -> Option<usize> {
        match self {
            ModelWeights::Needle2(w) => w.confidence.as_ref().map(|h| h.probes.shape[0]),
            ModelWeights::Needle3(w) => w.confidence.as_ref().map(|h| h.gain.data.len()),
        }
    }
}

/// Builds the graph `desc` describes from `weights` of the same generation.
///
/// # Panics
/// When `weights` are of another generation than `desc.config` (a caller bug: both come
/// from one file).
pub fn build(desc: &ExportDescription, weights: &ModelWeights) -> ModelProto {
    match (&desc.config, weights) {
        (ModelConfig::Needle2(cfg), ModelWeights::Needle2(w)) => stream::build(desc, cfg, w),
        (ModelConfig::Needle3(cfg), ModelWeights::Needle3(w)) => stream::build(desc, cfg, w),
        _ => panic!("the weights are of another generation than the description"),
    }
}
