//! What the runner's integration tests share. Each test binary compiles it for itself
//! and uses part of it, so what one leaves unused is not dead.
#![allow(dead_code)]

pub mod server;
