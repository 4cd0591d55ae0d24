//! The Needle 2 Simple Attention Network (`needle/model/architecture.py`,
//! `cactus-needle==2.0.15`) as an ONNX graph.
pub mod attention;
pub mod block_quant;
pub mod config;
pub mod context;
pub mod cq_kernel;
pub mod cq_rows;
pub mod engram;
pub mod hadamard_mlp;
pub mod hyper_connections;
pub mod model;
pub mod norms;
pub mod probe_heads;
pub mod token_history;
pub mod weights;

pub use config::Config;
pub use context::BuildContext;
pub use model::build;
pub use weights::{
    CqRows, EngramTables, EngramWeights, HeadKind, LayerWeights, MhcWeights, ProbeHead, Tensor,
    Weights,
};
