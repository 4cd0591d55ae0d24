//! libneedle_kernels in stock Python onnxruntime (the project venv's, the pin), registered
//! as a user does it (`SessionOptions.register_custom_ops_library`): packed graphs of a
//! Needle 2 and a Needle 3 fixture match upstream's logits within the contract's bound, and
//! a kernel's error reaches Python as an onnxruntime error, the process intact.

use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use graphs::builder::{Attr, Dim, GraphBuilder, Opset};
use graphs::contract::{
    needle_ops, AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant,
};
use graphs::onnx::data_type::{FLOAT, FLOAT16, UINT8};
use prost::Message;
use std::path::{Path, PathBuf};
use test_support::{fixture, python, read_fixture, repo_root, scratch};

/// The contract's bound on the relative error against upstream (fp32).
const TOLERANCE: f64 = 1e-4;

/// The library cargo built for this test, in the `deps/` directory this test runs from
/// (`kernel-library/Cargo.toml` says why it is there).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = format!(
        "{}needle_kernels{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let path = deps.join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// Runs `tests/python/<script>` with `args` in the project venv: its JSON line.
fn run_python(script: &str, args: &[&Path]) -> serde_json::Value {
    let out = python()
        .arg(repo_root().join("tests/python").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Fixture `model` exported with packed weights and `attention` into `dir`.
fn packed_graph(dir: &Path, model: &str, attention: AttentionKind) -> PathBuf {
    let variant = Variant {
        attention,
        precision: Precision::Fp32,
        matmul_weights: MatMulWeights::Packed,
        runtime: RuntimeTarget::Since1_24,
    };
    let cact = read_fixture(&format!("{model}.cact"));
    let onnx = NeedleModel::from_bytes("model.cact", &cact)
        .unwrap()
        .export(&ExportOptions::in_memory(variant));
    let path = dir.join(format!("{}.{attention:?}.onnx", model.replace('/', "_")));
    std::fs::write(&path, onnx).unwrap();
    path
}

/// m48 (ternary, 2-, 3- and 4-bit CQ) and n3q (CQ 1, 2, 3, 4 and ternary): every width
/// the kernels read, both attention variants, every upstream case whole and its first row
/// through the KV cache (`tests/python/check_onnx.py`).
#[test]
fn packed_graphs_match_upstream_in_python_onnxruntime_with_the_library() {
    let library = library();
    let dir = scratch("kernel-library");
    for model in ["m48", "needle3/n3q"] {
        for attention in [AttentionKind::FUSED, AttentionKind::Reference] {
            let graph = packed_graph(&dir, model, attention);
            let cases = fixture(&format!("{model}.cases.safetensors"));
            let report = run_python("check_onnx.py", &[&graph, &cases, &library]);
            let ran_needle_ops = report["session_ops"]
                .as_array()
                .unwrap()
                .contains(&needle_ops::CQ_MATMUL.into());
            assert!(ran_needle_ops, "{model} {attention:?}: {report}");
            let errors = report["max_rel_error"].as_object().unwrap();
            assert!(!errors.is_empty(), "{model} {attention:?}: no cases");
            for (case, error) in errors {
                let error = error.as_f64().unwrap();
                println!("{model} {attention:?} {case}: {error:.2e}");
                assert!(error <= TOLERANCE, "{model} {attention:?} {case}: {error}");
            }
        }
    }
}

/// One `needle.CqMatMul` of a 4 × 16 matrix (2-bit codes, one group of 16) whose input
/// `x` may have any width, so a wrong one reaches the kernel (`kernel_library_error.py`).
fn cq_matmul_graph() -> Vec<u8> {
    let mut b = GraphBuilder::new(Opset::V21, Precision::Fp32);
    let x = b.input("x", FLOAT, &[Dim::Named("tokens"), Dim::Named("width")]);
    let codes = b.input("codes", UINT8, &[Dim::Fixed(4), Dim::Fixed(4)]);
    let norms = b.input("norms", FLOAT16, &[Dim::Fixed(4), Dim::Fixed(1)]);
    let codebook = b.input("codebook", FLOAT, &[Dim::Fixed(4)]);
    let attrs = vec![
        ("cols", Attr::Int(16)),
        ("group", Attr::Int(16)),
        ("bits", Attr::Int(2)),
    ];
    let inputs = [&x, &codes, &norms, &codebook];
    let y = b.op_in(needle_ops::DOMAIN, needle_ops::CQ_MATMUL, &inputs, attrs, 1);
    b.output(&y[0], "y", FLOAT, &[Dim::Named("tokens"), Dim::Fixed(4)]);
    b.finish("cq_matmul", String::new(), Vec::new())
        .encode_to_vec()
}

#[test]
fn a_kernel_error_reaches_python_as_an_onnxruntime_error() {
    let dir = scratch("kernel-library-error");
    let graph = dir.join("cq_matmul.onnx");
    std::fs::write(&graph, cq_matmul_graph()).unwrap();
    let report = run_python("kernel_library_error.py", &[&graph, &library()]);
    assert_eq!(
        report["output_shape"],
        serde_json::json!([1, 4]),
        "{report}"
    );
    let error = &report["error"];
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("needle.CqMatMul: X is [1, 8], its last axis must be cols = 16"),
        "{report}"
    );
    assert_eq!(error["type"], "Fail", "{report}");
}
