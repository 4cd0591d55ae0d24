//! A model's geometry whatever its generation: the one dispatch over the two configs,
//! and the generation-neutral accessors the runner reads.

use crate::contract::{Generation, HeadShape};
use crate::geometry::{CommonGeometry, Geometry};
use crate::metadata::GeometryFields;
use crate::{needle2, needle3};

/// A model's geometry, whatever its generation.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelConfig {
    Needle2(needle2::Config),
    Needle3(needle3::Config),
}

impl ModelConfig {
    pub fn generation(&self) -> Generation {
        match self {
            ModelConfig::Needle2(_) => Generation::Needle2,
            ModelConfig::Needle3(_) => Generation::Needle3,
        }
    }

    fn geometry(&self) -> &dyn Geometry {
        match self {
            ModelConfig::Needle2(c) => c,
            ModelConfig::Needle3(c) => c,
        }
    }

    /// What both generations record alike.
    pub fn common(&self) -> &CommonGeometry {
        self.geometry().common()
    }

    pub fn num_layers(&self) -> usize {
        self.common().num_layers
    }

    pub fn max_seq_len(&self) -> usize {
        self.common().max_seq_len
    }

    /// Token ids the model reads.
    pub fn vocab(&self) -> usize {
        self.common().vocab
    }

    /// Width of `logits`: the ids the model can produce.
    pub fn output_vocab(&self) -> usize {
        match self {
            ModelConfig::Needle2(c) => c.common.vocab,
            ModelConfig::Needle3(c) => c.out_vocab,
        }
    }

    /// The attention heads' layout.
    pub fn head_shape(&self) -> HeadShape {
        self.geometry().head_shape()
    }

    /// Width of the engram token history state.
    pub fn engram_history(&self) -> usize {
        self.common().engram.history()
    }

    /// The keys a windowed layer's query sees, its own among them, when that window binds
    /// (is shorter than `max_seq_len`).
    pub fn sliding_window(&self) -> Option<usize> {
        match self {
            ModelConfig::Needle2(c) => c.sliding_window(),
            ModelConfig::Needle3(c) => (0..c.common.num_layers).find_map(|l| c.window_of(l)),
        }
    }

    /// The keys any layer's query sees, its own among them, when every layer attends
    /// within a window that binds (Needle 2's `kv_window`; a Needle 3 without global
    /// layers): no query reads a key further back, so a cache may drop older ones. `None`
    /// when some layer reads the whole past.
    pub fn window_of_every_layer(&self) -> Option<usize> {
        match self {
            ModelConfig::Needle2(c) => c.sliding_window(),
            ModelConfig::Needle3(c) => (0..c.common.num_layers)
                .map(|l| c.window_of(l))
                .try_fold(0, |widest, w| w.map(|w| w.max(widest))),
        }
    }

    /// `(slots, width)` of each layer's QKV-conv state (Needle 3 with conv taps).
    pub fn qkv_conv_state(&self) -> Option<(usize, usize)> {
        match self {
            ModelConfig::Needle2(_) => None,
            ModelConfig::Needle3(c) => c.qkv_conv_state(),
        }
    }

    /// The geometry as `metadata_props` entries (lists comma-separated).
    pub fn to_metadata(&self) -> Vec<(String, String)> {
        match self {
            ModelConfig::Needle2(c) => c.to_metadata(),
            ModelConfig::Needle3(c) => c.to_metadata(),
        }
    }

    /// Reads a `generation` geometry back; the error names the missing or malformed key.
    pub fn from_metadata(
        generation: Generation,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        Ok(match generation {
            Generation::Needle2 => ModelConfig::Needle2(needle2::Config::from_metadata(get)?),
            Generation::Needle3 => ModelConfig::Needle3(needle3::Config::from_metadata(get)?),
        })
    }
}
