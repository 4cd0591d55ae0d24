pub mod builder;
pub mod needle;
pub mod onnx;
mod ops;
