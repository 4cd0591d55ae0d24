//! Runs exported Needle 2 graphs through onnxruntime: execution providers chosen at
//! startup, the tokenizer, KV-cached generation and tool calling (`needle-run`).
pub mod generate;
pub mod model;
pub mod ort_env;
pub mod prompt;
pub mod provider;
pub mod runner;
pub mod session;
pub use exporter::tokenizer;
