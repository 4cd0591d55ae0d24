//! An exported `.onnx` runs only with a tokenizer that fits it: one with more pieces than
//! the graph embeds, or any other file than the one it was exported with (its SHA-256 is
//! in the graph), is one error line naming the mismatch, exit 1.

use exporter::model::NeedleModel;
use exporter::output::ExportFiles;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget};
use runner::load::DEMO_CACT;
use std::path::Path;
use std::process::Command;
use test_support::{fixture, scratch};

fn export(model: &NeedleModel, onnx: &Path) {
    let tokenizer = NeedleTokenizer::from_spec(&model.tokenizer, true).unwrap();
    ExportFiles::beside(onnx, &[AttentionKind::FUSED])
        .write(
            model,
            &tokenizer,
            Precision::Fp32,
            MatMulWeights::Float,
            RuntimeTarget::Since1_24,
        )
        .unwrap();
}

fn fails_with(onnx: &Path, says: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_needle-run"))
        .arg("--model")
        .arg(onnx)
        .args([
            "--provider",
            "cpu",
            "--raw",
            "hello",
            "--max-new-tokens",
            "2",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(says), "wanted {says:?} in: {err}");
}

#[test]
fn a_tokenizer_of_another_model_is_refused_by_name() {
    let dir = scratch("mismatch");
    let m64 = NeedleModel::read(&fixture("m64.cact")).unwrap();
    let demo = NeedleModel::from_bytes("needle-demo.cact", DEMO_CACT).unwrap();
    let onnx = dir.join("m64.onnx");
    export(&m64, &onnx);
    export(&demo, &dir.join("demo.onnx"));
    std::fs::copy(
        dir.join("demo.tokenizer.json"),
        dir.join("m64.tokenizer.json"),
    )
    .unwrap();
    fails_with(&onnx, "has 1024 pieces, more than the 512 ids");
}

/// A tokenizer of the same size that is not the one exported (here two pieces swapped, as
/// another model's vocabulary would differ) passes the piece count; the checksum the graph
/// records of its own tokenizer file catches it.
#[test]
fn a_tokenizer_that_is_not_the_exported_one_is_refused_by_its_checksum() {
    let dir = scratch("mismatch-checksum");
    let m64 = NeedleModel::read(&fixture("m64.cact")).unwrap();
    let onnx = dir.join("m64.onnx");
    export(&m64, &onnx);
    let path = dir.join("m64.tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
    vocab.insert("a".into(), b);
    vocab.insert("b".into(), a);
    std::fs::write(&path, json.to_string()).unwrap();
    fails_with(&onnx, "is not the tokenizer");
}
