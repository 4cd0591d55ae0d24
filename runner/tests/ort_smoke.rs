//! onnxruntime through `ort`, end to end on a two-node model made by the venv's `onnx`:
//! library discovery, provider registration, tensors in and out, metadata, IoBinding.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use ort::{
    ep::{self, ExecutionProvider},
    session::Session,
    value::Tensor,
};
use runner::{
    ort_env,
    provider::{self, Provider},
};

/// `y = x * 2 + 1` over `x: float[batch, 3]`, IR 10, opset 21, metadata `needle.answer = 42`.
const MAKE_MODEL: &str = r#"
import sys, onnx
from onnx import TensorProto, helper
graph = helper.make_graph(
    [helper.make_node("Mul", ["x", "two"], ["doubled"], name="/model/Mul"),
     helper.make_node("Add", ["doubled", "one"], ["y"], name="/model/Add")],
    "smoke",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
     helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
helper.set_model_props(model, {"needle.answer": "42"})
onnx.checker.check_model(model, full_check=True)
onnx.save(model, sys.argv[1])
"#;

fn smoke_model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ort_smoke.onnx");
        let status = test_support::python()
            .arg("-c")
            .arg(MAKE_MODEL)
            .arg(&path)
            .status()
            .unwrap_or_else(|e| panic!("the venv python: {e}; run scripts/setup-tests"));
        assert!(status.success(), "making the smoke model failed");
        path
    })
}

fn cpu_session(model: &Path) -> Session {
    let environment = ort_env::init().expect("onnxruntime");
    let mut registered =
        provider::session_builder(environment, Provider::Cpu, false, 1).expect("cpu");
    assert_eq!(registered.provider, Provider::Cpu);
    registered.builder.commit_from_file(model).expect("session")
}

fn cuda_in_this_build() -> bool {
    ort_env::init().expect("onnxruntime");
    ep::CUDA::is_available().expect("provider list")
}

#[test]
fn init_is_idempotent() {
    let first = ort_env::init().expect("onnxruntime") as *const _;
    let second = ort_env::init().expect("onnxruntime") as *const _;
    assert_eq!(first, second);
    assert!(ort_env::library_path()
        .expect("library")
        .ends_with(ort_env::ORT_LIBRARY));
}

#[test]
fn runs_an_input_and_reads_metadata() {
    let mut session = cpu_session(smoke_model());
    let metadata = session.metadata().expect("metadata");
    assert_eq!(metadata.custom("needle.answer").as_deref(), Some("42"));
    assert!(metadata
        .custom_keys()
        .expect("keys")
        .contains(&"needle.answer".to_string()));
    assert_eq!(metadata.custom("absent"), None);
    drop(metadata);

    let x = vec![0.0f32, 1.0, 2.0, -1.0, 0.5, 10.0];
    let outputs = session
        .run(ort::inputs!["x" => Tensor::from_array(([2usize, 3], x)).expect("tensor")])
        .expect("run");
    let (shape, y) = outputs["y"]
        .try_extract_tensor::<f32>()
        .expect("f32 output");
    assert_eq!(&shape[..], &[2, 3]);
    assert_eq!(y, [1.0, 3.0, 5.0, -1.0, 2.0, 21.0]);
}

#[test]
fn runs_shape_and_vec_input_from_memory() {
    let bytes = std::fs::read(smoke_model()).expect("model bytes");
    let environment = ort_env::init().expect("onnxruntime");
    let mut session = provider::session_builder(environment, Provider::Cpu, false, 0)
        .expect("cpu")
        .builder
        .commit_from_memory(&bytes)
        .expect("session");
    assert_eq!(session.inputs()[0].name(), "x");
    assert_eq!(session.outputs()[0].name(), "y");

    let x = Tensor::from_array(([1usize, 3], vec![1.0f32, 2.0, 3.0])).expect("tensor");
    let outputs = session.run(ort::inputs![x]).expect("run");
    let (shape, y) = outputs[0].try_extract_tensor::<f32>().expect("f32 output");
    assert_eq!(&**shape, &[1, 3]);
    assert_eq!(y, &[3.0, 5.0, 7.0]);
}

#[test]
fn io_binding_keeps_outputs_on_the_session_device() {
    let mut session = cpu_session(smoke_model());
    let x = Tensor::from_array(([2usize, 3], vec![0.0f32; 6])).expect("tensor");
    let mut binding = session.create_binding().expect("binding");
    binding.bind_input("x", &x).expect("bind x");
    binding
        .bind_output_to_device("y", session.allocator().memory_info())
        .expect("bind y");
    let outputs = session.run_binding(&binding).expect("run");
    let (shape, y) = outputs["y"]
        .try_extract_tensor::<f32>()
        .expect("f32 output");
    assert_eq!(&**shape, &[2, 3]);
    assert_eq!(y, &[1.0; 6]);
}

#[test]
fn named_cuda_without_cuda_is_an_error_naming_cuda() {
    if cuda_in_this_build() {
        return;
    }
    let environment = ort_env::init().expect("onnxruntime");
    let error = provider::session_builder(environment, Provider::Cuda, false, 1)
        .err()
        .expect("cuda must not register on a CPU-only onnxruntime");
    assert!(
        matches!(&error, provider::ProviderError::Unavailable(u) if u.provider == Provider::Cuda),
        "{error:?}"
    );
    assert!(error.to_string().contains("cuda"), "{error}");
}

#[test]
fn named_cuda_with_fallback_reports_cpu() {
    if cuda_in_this_build() {
        return;
    }
    let environment = ort_env::init().expect("onnxruntime");
    let mut registered =
        provider::session_builder(environment, Provider::Cuda, true, 1).expect("fallback");
    assert_eq!(registered.provider, Provider::Cpu);
    let skipped: Vec<_> = registered.skipped.iter().map(|u| u.provider).collect();
    assert_eq!(skipped, [Provider::Cuda]);
    registered
        .builder
        .commit_from_file(smoke_model())
        .expect("cpu session");
}

#[test]
fn auto_reports_what_it_got() {
    if cuda_in_this_build() {
        return;
    }
    let environment = ort_env::init().expect("onnxruntime");
    let registered =
        provider::session_builder(environment, Provider::Auto, false, 1).expect("auto");
    assert_eq!(registered.provider, Provider::Cpu);
    let skipped: Vec<_> = registered.skipped.iter().map(|u| u.provider).collect();
    assert_eq!(
        skipped,
        [Provider::TensorRt, Provider::Cuda, Provider::CoreMl]
    );
}
