//! ONNX IR types, a small graph builder, and the Needle 2 and Needle 3 graphs: the
//! contract (`contract`, a leaf), the typed metadata (`description`), the geometry both
//! generations share (`geometry`, `config`), the shared blocks (`blocks`), the stream
//! written once (`stream`) and each generation's part of it (`needle2`, `needle3`).
pub mod accelerator;
pub mod blocks;
pub mod builder;
pub mod config;
pub mod contract;
pub mod description;
pub mod encoding;
pub mod geometry;
mod metadata;
pub mod model;
pub mod needle2;
pub mod needle3;
pub mod onnx;
mod ops;
mod stream;

pub use metadata::GeometryFields;
