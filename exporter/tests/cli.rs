//! `needle-export` end to end: the files it writes pass `onnx.checker` (full check)
//! and reproduce the upstream fixtures in stock Python onnxruntime; bad input and
//! unsafe destinations are refused with one line and no output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use test_support::{fixture, python_in, repo_root, scratch};

fn export(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_needle-export"))
        .args(args)
        .output()
        .unwrap()
}

/// fp32 graphs: the contract's bound on the relative error against upstream.
const FP32_BOUND: f64 = 1e-4;
/// fp16 graphs (measured up to 1.8e-3 on the fixtures).
const FP16_BOUND: f64 = 5e-3;

/// What `tests/python/check_onnx.py` reports on one graph.
struct Report {
    /// The relative error against upstream of each case (and each case's cached run).
    errors: Vec<(String, f64)>,
    /// The domains of the graph's nodes.
    node_domains: Vec<String>,
    /// The op types the onnxruntime session runs, after its graph optimizations.
    session_ops: Vec<String>,
    /// The initializers it keeps after them (constant folding replaces what it folds).
    session_initializers: Vec<String>,
}

/// `tests/python/check_onnx.py` on `graph` with the Python of `venv`, every case of `model`
/// asserted within `bound` of upstream.
fn check_in(venv: &str, graph: &Path, model: &str, bound: f64) -> Report {
    let report = report_in(venv, graph, model);
    for (case, err) in &report.errors {
        assert!(
            *err <= bound,
            "{venv} {} case {case}: {err}",
            graph.display()
        );
    }
    report
}

/// `tests/python/check_onnx.py` on `graph` with the Python of `venv`, against `model`'s cases.
fn report_in(venv: &str, graph: &Path, model: &str) -> Report {
    let check = python_in(venv)
        .arg(repo_root().join("tests/python/check_onnx.py"))
        .arg(graph)
        .arg(fixture(&format!("{model}.cases.safetensors")))
        .output()
        .unwrap();
    let what = format!("{venv} {}", graph.display());
    assert!(
        check.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    println!("{what}: {}", report["max_rel_error"]);
    let strings = |key: &str| -> Vec<String> {
        let values = report[key].as_array().unwrap().iter();
        values.map(|v| v.as_str().unwrap().to_string()).collect()
    };
    let errors = report["max_rel_error"].as_object().unwrap().iter();
    Report {
        errors: errors
            .map(|(case, err)| (case.clone(), err.as_f64().unwrap()))
            .collect(),
        node_domains: strings("node_domains"),
        session_ops: strings("session_ops"),
        session_initializers: strings("session_initializers"),
    }
}

/// `tests/python/check_onnx.py` on `graph` with the Python of `venv` fails to load it,
/// onnxruntime saying why.
fn load_fails_in(venv: &str, graph: &Path, model: &str, says: &str) {
    let check = python_in(venv)
        .arg(repo_root().join("tests/python/check_onnx.py"))
        .arg(graph)
        .arg(fixture(&format!("{model}.cases.safetensors")))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        !check.status.success() && err.contains(says),
        "{venv}: {err}"
    );
}

/// Exports `model` with `--attention both` and `extra` flags into `dir`: (fused, reference).
fn export_both(dir: &Path, model: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let out = dir.join(format!("{model}.onnx"));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let cact = fixture(&format!("{model}.cact"));
    let flags = ["--attention", "both", "--force"].iter().chain(extra);
    let args: Vec<&Path> = [cact.as_path(), &out]
        .into_iter()
        .chain(flags.map(Path::new))
        .collect();
    let o = export(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (out, dir.join(format!("{model}.reference.onnx")))
}

#[test]
fn both_variants_pass_the_onnx_checker_and_match_upstream_in_python_onnxruntime() {
    let dir = scratch("stock");
    let needle3 = [
        "needle3/n3a",
        "needle3/n3b",
        "needle3/n3c",
        "needle3/n3q",
        "needle3/n3a_d4",
    ];
    for model in ["m48", "m64", "m96", "m64w"].into_iter().chain(needle3) {
        let (fused, reference) = export_both(&dir, model, &[]);
        check_in(".venv", &fused, model, FP32_BOUND);
        let report = check_in(".venv", &reference, model, FP32_BOUND);
        assert_eq!(
            report.node_domains,
            [""],
            "{model}: reference graph must be ai.onnx only"
        );
        assert!(dir.join(format!("{model}.tokenizer.json")).exists());
    }
}

/// `--external-data`: each graph's initializers of 64 KiB or more go to `GRAPH.onnx.data`
/// beside it, each at a 64 KiB-aligned offset (onnxruntime memory-maps those); the checker's
/// full check (which reads the data file) passes and stock onnxruntime matches upstream,
/// for both graphs of `--attention both`. Both fixtures have several initializers that
/// large (m96's and n3c's wider layers), so padding lies between them.
#[test]
fn external_data_goes_beside_each_graph_and_matches_upstream() {
    use graphs::onnx::{ModelProto, EXTERNAL};
    use prost::Message;
    let dir = scratch("external-data");
    for model in ["m96", "needle3/n3c"] {
        for graph in <[PathBuf; 2]>::from(export_both(&dir, model, &["--external-data"])) {
            check_in(".venv", &graph, model, FP32_BOUND);
            let data_len = std::fs::metadata(format!("{}.data", graph.display()))
                .unwrap()
                .len() as usize;
            let proto = ModelProto::decode(&std::fs::read(&graph).unwrap()[..]).unwrap();
            let mut ends = Vec::new();
            for t in proto.graph.unwrap().initializer {
                let external = t.data_location == EXTERNAL;
                assert!(
                    external || t.raw_data.len() < 64 << 10,
                    "{model}: {} stayed in the graph",
                    t.name
                );
                if external {
                    let field = |key: &str| -> usize {
                        let entry = t.external_data.iter().find(|e| e.key == key).unwrap();
                        entry.value.parse().unwrap()
                    };
                    assert_eq!(field("offset") % (64 << 10), 0, "{model}: {}", t.name);
                    ends.push(field("offset") + field("length"));
                }
            }
            assert!(ends.len() > 1, "{model}: {} initializers moved", ends.len());
            assert_eq!(ends.iter().max(), Some(&data_len), "{model}");
        }
    }
}

/// An existing data file is a destination like the graph: kept unless forced, and the
/// export writes nothing; `--target`'s graphs take no data file.
#[test]
fn an_existing_data_file_is_kept_and_target_refuses_external_data() {
    let dir = scratch("external-data-force");
    let (out, data) = (dir.join("m.onnx"), dir.join("m.onnx.data"));
    std::fs::write(&data, b"keep me").unwrap();
    let o = export(&[&fixture("m64.cact"), &out, Path::new("--external-data")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("m.onnx.data") && err.contains("--force"));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(std::fs::read(&data).unwrap(), b"keep me");
    assert!(!out.exists());
    let o = export(&[
        &fixture("m64.cact"),
        &dir.join("t.onnx"),
        Path::new("--target"),
        Path::new("coreml"),
        Path::new("--external-data"),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--external-data"),
        "{err}"
    );
    assert!(!dir.join("t.onnx").exists());
}

/// `--weights cq` keeps the `.cact`'s codes in the file and stock onnxruntime folds them
/// into float kernels at session creation: the checker passes, the upstream cases hold,
/// and no kernel's codes are left for the running session (the embedding's and engram
/// tables' rows are decoded as gathered, so their codes stay). n3q carries every CQ width.
#[test]
fn cq_weights_pass_the_checker_match_upstream_and_fold_at_session_creation() {
    let dir = scratch("cq-weights");
    for model in ["m48", "m64w", "needle3/n3a", "needle3/n3q"] {
        for graph in <[PathBuf; 2]>::from(export_both(&dir, model, &["--weights", "cq"])) {
            let report = check_in(".venv", &graph, model, FP32_BOUND);
            let left: Vec<&String> = report
                .session_initializers
                .iter()
                .filter(|name| name.ends_with("kernel.codes"))
                .collect();
            assert!(left.is_empty(), "{model}: not folded: {left:?}");
            assert!(
                report
                    .session_initializers
                    .iter()
                    .any(|n| n == "embed_tokens.embedding.codes"),
                "{model}: the embedding should stay codes"
            );
        }
    }
}

/// The README's runtime table for older Python onnxruntime releases: the fused graph from
/// 1.24 (1.23 too, but for sliding-window models: onnxruntime 1.24 changed
/// `local_window_size` by one; not before, IR 11), the reference graph (fp32 and fp16) from
/// 1.20.
#[test]
fn older_onnxruntime_releases_run_the_graphs_the_readme_lists() {
    let dir = scratch("older-ort");
    for model in ["m48", "m64", "m96", "m64w"] {
        let windowed = model == "m64w";
        let (fused, reference) = export_both(&dir, model, &[]);
        check_in(".venv-ort-1.24.4", &fused, model, FP32_BOUND);
        check_in(".venv-ort-1.24.4", &reference, model, FP32_BOUND);
        if !windowed {
            check_in(".venv-ort-1.23.2", &fused, model, FP32_BOUND);
        }
        check_in(".venv-ort-1.23.2", &reference, model, FP32_BOUND);
        check_in(".venv-ort-1.20.1", &reference, model, FP32_BOUND);
        if model == "m64" {
            for venv in [".venv-ort-1.20.1", ".venv-ort-1.22.1"] {
                load_fails_in(venv, &fused, model, "Unsupported model IR version: 11");
            }
        }
        let half = dir.join("fp16");
        std::fs::create_dir_all(&half).unwrap();
        let (_, reference) = export_both(&half, model, &["--precision", "fp16"]);
        check_in(".venv-ort-1.20.1", &reference, model, FP16_BOUND);
    }
}

/// The README's runtime table for `--onnxruntime 1.20`: its fused graph (IR 10, opset 21)
/// on every release from 1.20 (fp32 and fp16), but for sliding-window models on 1.24 and
/// later, which count its window one key narrower; the reference graph on 1.22.
#[test]
fn the_fused_graph_for_onnxruntime_1_20_runs_where_the_readme_lists() {
    let dir = scratch("onnxruntime-1.20");
    let target = ["--onnxruntime", "1.20"];
    for model in ["m48", "m64", "m96", "m64w"] {
        let (fused, reference) = export_both(&dir, model, &target);
        for venv in [".venv-ort-1.20.1", ".venv-ort-1.22.1", ".venv-ort-1.23.2"] {
            let report = check_in(venv, &fused, model, FP32_BOUND);
            runs_its_rms_kernel(venv, &report);
        }
        check_in(".venv-ort-1.22.1", &reference, model, FP32_BOUND);
        for venv in [".venv-ort-1.24.4", ".venv"] {
            if model == "m64w" {
                let errors = report_in(venv, &fused, model).errors;
                assert!(
                    errors.iter().all(|(_, err)| *err > FP32_BOUND),
                    "{venv}: the window should be one key narrower: {errors:?}"
                );
            } else {
                let report = check_in(venv, &fused, model, FP32_BOUND);
                runs_its_rms_kernel(venv, &report);
            }
        }
        let half = dir.join("fp16");
        std::fs::create_dir_all(&half).unwrap();
        let (fused, _) = export_both(
            &half,
            model,
            &[&target[..], &["--precision", "fp16"]].concat(),
        );
        check_in(".venv-ort-1.20.1", &fused, model, FP16_BOUND);
    }
}

/// The `--onnxruntime 1.20` graph writes its norms as opset-21 primitives
/// (`Pow`/`ReduceMean`/`Add`/`Sqrt`/`Div`/`Mul`) that onnxruntime fuses into its RMS
/// kernel, which makes it as fast as the opset-23 graph: no `Pow` of them may be left in
/// the session. (A `Sqrt` may: the contrastive head's L2 norm of a model that has one.)
fn runs_its_rms_kernel(venv: &str, report: &Report) {
    let ops = &report.session_ops;
    assert!(
        ops.iter().any(|op| op == "SimplifiedLayerNormalization")
            && !ops.iter().any(|op| op == "Pow"),
        "{venv}: the norms were not fused: {ops:?}"
    );
}

#[test]
fn an_existing_output_is_kept_unless_forced() {
    let dir = scratch("force");
    let out = dir.join("m.onnx");
    std::fs::write(&out, b"keep me").unwrap();
    let o = export(&[&fixture("m64.cact"), &out]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let o = Command::new(env!("CARGO_BIN_EXE_needle-export"))
        .arg(fixture("m64.cact"))
        .arg(&out)
        .arg("--force")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_ne!(std::fs::read(&out).unwrap(), b"keep me");
}

#[test]
fn writing_over_the_input_is_refused() {
    let dir = scratch("input");
    let input = dir.join("model.cact");
    std::fs::copy(fixture("m64.cact"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_needle-export"))
        .arg(&input)
        .arg(&input)
        .arg("--force")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

#[test]
fn an_invalid_model_is_one_error_line_and_no_output() {
    let dir = scratch("invalid");
    let bad = dir.join("bad.cact");
    let mut bytes = std::fs::read(fixture("m64.cact")).unwrap();
    bytes.truncate(1000);
    std::fs::write(&bad, &bytes).unwrap();
    let needle3 = dir.join("needle3.cact");
    let mut bytes = std::fs::read(fixture("m64.cact")).unwrap();
    bytes[..4].copy_from_slice(&0x05E1_2A84u32.to_le_bytes());
    std::fs::write(&needle3, &bytes).unwrap();
    for (input, says) in [
        (bad, "bad.cact"),
        (needle3, "Needle 3"),
        (dir.join("missing.cact"), "missing.cact"),
    ] {
        let out = dir.join("out.onnx");
        let o = Command::new(env!("CARGO_BIN_EXE_needle-export"))
            .arg(&input)
            .arg(&out)
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!out.exists());
        assert_eq!(
            std::fs::read_dir(&dir)
                .unwrap()
                .filter(|e| e
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp"))
                .count(),
            0
        );
    }
}

#[test]
fn genai_writes_one_folder_and_refuses_two_graphs_or_overwrites() {
    let dir = scratch("genai-cli").join("folder");
    let o = export(&[&fixture("m64.cact"), &dir, Path::new("--genai")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for file in [
        "model.onnx",
        "model.tokenizer.json",
        "genai_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("genai_config.json")).unwrap()).unwrap();
    // m64's 4 attention layers' cache pairs and the token history's.
    assert_eq!(config["model"]["decoder"]["num_hidden_layers"], 5);
    let again = export(&[&fixture("m64.cact"), &dir, Path::new("--genai")]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    let both = export(&[
        &fixture("m64.cact"),
        &dir,
        Path::new("--genai"),
        Path::new("--attention"),
        Path::new("both"),
        Path::new("--force"),
    ]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("one graph"));
}

/// What a fused graph for onnxruntime 1.20–1.23 cannot be is refused in one line, before
/// anything is written: a genai folder (genai 0.18 runs onnxruntime 1.24 and later), and a
/// sliding window of one key (`local_window_size` 0 is no window there).
#[test]
fn what_the_onnxruntime_1_20_graph_cannot_be_is_one_error_line_and_no_output() {
    let dir = scratch("onnxruntime-1.20-refused");
    let one_key = dir.join("one-key-window.cact");
    let mut bytes = std::fs::read(fixture("m64w.cact")).unwrap();
    let at = exporter::cact::needle2::layout::header_offset("kv_window") as usize;
    bytes[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&one_key, &bytes).unwrap();
    let target = ["--onnxruntime", "1.20"].map(Path::new);
    let genai = dir.join("genai");
    let out = dir.join("out.onnx");
    for (args, says) in [
        (
            vec![fixture("m64.cact").as_path(), &genai, Path::new("--genai")],
            "--genai",
        ),
        (vec![one_key.as_path(), &out], "1 key"),
        (
            vec![
                one_key.as_path(),
                &out,
                Path::new("--attention"),
                Path::new("both"),
            ],
            "1 key",
        ),
    ] {
        let o = export(&[&args[..], &target].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "{err}");
    }
    let reference = [
        one_key.as_path(),
        &out,
        Path::new("--attention"),
        Path::new("reference"),
    ];
    for args in [&reference[..2], &[&reference[..], &target].concat()] {
        let o = export(&[args, &[Path::new("--force")]].concat());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}
