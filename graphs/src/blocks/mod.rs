//! The blocks both generations are built from: attention cores, norms, the engram memory,
//! hyper-connections, the tied embedding and head, the token history, probe pooling, and
//! the weight storages (dense, `MatMulNBits`, CQ codes). Each reads only the geometry
//! the generations share (`crate::geometry`).
pub mod attention;
pub mod block_quant;
pub mod context;
pub mod cq_kernel;
pub mod cq_matmul;
pub mod cq_node;
pub mod cq_rows;
pub mod embedding;
pub mod engram;
pub mod hadamard;
pub mod hyper_connections;
pub mod needle_attention;
pub mod norms;
pub mod probe_pool;
pub mod token_history;
pub mod transpose;
pub mod weights;
