//! The stock graphs of models with probe heads, as onnxruntime runs them by default: no
//! layer's residual stream outlives the layer after its own
//! (`tests/python/stream_lifetimes.py` reads the order from onnxruntime's profiler). The
//! heads read every layer's lane mean; built the other way round, onnxruntime's default
//! order took those means after the last layer and kept every layer's stream alive until
//! then (+250 MB for the confidence forward of a 776-token query to the full-size
//! Needle 3).

use std::path::Path;
use std::process::Command;
use test_support::{fixture, python, repo_root, scratch};

/// Models with probe heads: Needle 2's confidence and contrastive heads (m48h) and
/// Needle 3's confidence head (n3a).
const MODELS: [&str; 2] = ["m48h", "needle3/n3a"];
/// Tokens of the forward: a prompt, fed whole as the confidence forward feeds it.
const TOKENS: &str = "96";

#[test]
fn no_layers_stream_outlives_the_next_layer_in_onnxruntimes_default_order() {
    let dir = scratch("stream-lifetimes");
    for model in MODELS {
        for attention in ["fused", "reference"] {
            let out = dir.join(format!("{}-{attention}.onnx", model.replace('/', "-")));
            let export = Command::new(env!("CARGO_BIN_EXE_needle-export"))
                .arg(fixture(&format!("{model}.cact")))
                .arg(&out)
                .args(["--attention", attention, "--force"])
                .output()
                .unwrap();
            assert!(
                export.status.success(),
                "{}",
                String::from_utf8_lossy(&export.stderr)
            );
            let report = lifetimes(&out);
            println!("{model} {attention}: {report}");
            assert_eq!(
                report["layers_seen"], report["layers"],
                "{model} {attention}"
            );
            assert_eq!(
                report["long_lived"],
                serde_json::json!([]),
                "{model} {attention}"
            );
        }
    }
}

fn lifetimes(graph: &Path) -> serde_json::Value {
    let o = python()
        .arg(repo_root().join("tests/python/stream_lifetimes.py"))
        .arg(graph)
        .arg(TOKENS)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}
