//! The CPU kernels of the Needle op domain, written over plain slices: no onnxruntime type
//! reaches them, so `needle-run`'s in-process domain and a library that another
//! onnxruntime loads share one implementation.
//!
//! Every op has a scalar path, the reference each SIMD path is tested against, and the
//! SIMD paths this machine can run beside it; [`Isa::best`] picks one at run time.

pub mod attention;
pub mod attention_gate;
pub mod attention_heads;
pub mod conv_state;
pub mod cq_matmul;
pub mod engram_gate;
pub mod engram_rows;
pub mod engram_value;
pub mod f16;
mod hadamard;
pub mod hadamard_mlp;
pub mod hyper_connections;
pub mod isa;
pub mod math;
pub mod monarch_mlp;
pub mod probe_pool;
pub mod residual_norm;
pub mod sinkhorn;
pub mod small_matmul;
pub mod split;
mod transpose;

pub use cq_matmul::{cq_matmul, CqMatrix};
pub use isa::Isa;
pub use sinkhorn::sinkhorn;
pub use split::{RowSplit, Serial};

/// Why a kernel's tensors do not fit together (the op's inputs or attributes disagree): one
/// line saying what, for the op's error.
#[derive(Debug, PartialEq)]
pub struct ShapeError(pub String);

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}
