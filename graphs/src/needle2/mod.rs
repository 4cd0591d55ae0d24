//! The Needle 2 Simple Attention Network (`needle/model/architecture.py`,
//! `cactus-needle==2.0.15`): its config, weights, attention, Hadamard MLP and probe
//! heads; the stream around them and the shared blocks are `crate::stream` and
//! `crate::blocks`.
pub mod attention;
pub mod config;
pub mod hadamard_mlp;
pub mod heads;
mod model;
pub mod weights;

pub use config::Config;
pub use weights::{HeadKind, LayerWeights, ProbeHead, Weights};
