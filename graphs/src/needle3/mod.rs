//! The Needle 3 Simple Attention Network (`needle/model/architecture.py`,
//! `cactus-needle==3.2.8`): its config, weights, attention (split head widths, QKV conv,
//! local and global layers), Monarch MLP, confidence head and depth ladder; the stream
//! around them and the shared blocks are `crate::stream` and `crate::blocks`.
pub mod attention;
pub mod confidence;
pub mod config;
pub mod ladder;
mod model;
pub mod monarch_mlp;
pub mod weights;

pub use config::Config;
pub use weights::{HeadKind, LayerWeights, MonarchWeights, ProbeHead, QkvTaps, Weights};
