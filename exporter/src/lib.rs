//! Reads Needle `.cact` files into the typed, dequantized weights of the `graphs`
//! crate and exports them as ONNX (`needle-export`).
pub mod cact;
pub mod cli;
pub mod export;
pub mod genai;
pub mod model;
pub mod output;
pub mod tokenizer;
