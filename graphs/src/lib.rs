pub mod builder;
pub mod contract;
pub mod needle;
pub mod onnx;
mod ops;
