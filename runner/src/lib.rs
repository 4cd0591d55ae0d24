//! Runs exported Needle graphs of both generations (Needle 2 and Needle 3) through
//! onnxruntime: execution providers chosen at startup, the tokenizer, KV-cached
//! generation, continuous batching, tool calling and the OpenAI-compatible server
//! (`needle-run`).
pub mod accelerator;
pub mod answer;
pub mod batch;
pub mod cache;
pub mod constrain;
pub mod conversation;
pub mod decode;
pub mod engine;
pub mod generate;
pub mod graph_cache;
pub mod load;
pub mod needle_ops;
pub mod ort_env;
pub mod plan;
pub mod prompt;
pub mod provider;
pub mod python_json;
pub mod serve;
pub mod session;
pub mod step;
pub mod stream;
pub mod tool_list;
pub mod tool_schema;
pub use exporter::tokenizer;
