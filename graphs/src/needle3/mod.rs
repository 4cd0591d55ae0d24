//! The Needle 3 Simple Attention Network (`needle/model/architecture.py`,
//! `cactus-needle==3.2.8`), beside Needle 2's module tree: it shares Needle 2's
//! primitives (norms, engram, hyper-connections, the attention cores, embedding and
//! head) and has its own config, weights, attention block and Monarch MLP.
pub mod attention;
pub mod confidence;
pub mod config;
pub mod ladder;
pub mod model;
pub mod monarch_mlp;
pub mod weights;

pub use config::Config;
pub use model::build;
pub use weights::{HeadKind, LayerWeights, MonarchWeights, ProbeHead, QkvTaps, Weights};
