pub mod builder;
pub mod contract;
pub mod model;
pub mod needle;
pub mod needle3;
pub mod onnx;
mod ops;
