//! The Needle 3 Simple Attention Network (`needle/model/architecture.py`,
//! `cactus-needle==3.2.8`), beside Needle 2's module tree: it shares Needle 2's
//! primitives (norms, engram, hyper-connections, the attention cores) and has its own
//! config, weights, attention block and Monarch MLP.
pub mod config;
pub mod ladder;
pub mod weights;

pub use config::Config;
pub use weights::{HeadKind, LayerWeights, MonarchWeights, ProbeHead, QkvTaps, Weights};
