//! What the runner's integration tests share. Each test binary compiles it for itself
//! and uses part of it, so what one leaves unused is not dead.
#![allow(dead_code)]

pub mod server;

use serde_json::Value;
use test_support::fixture;

/// Upstream's greedy generations of `model` (`<model>.generate.json`): each with its
/// `prompt` text, `prompt_ids`, `generated_ids` and `generated_text`.
pub fn generate_refs(model: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(&format!("{model}.generate.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}
