//! `needle-run` on the accelerator graphs (`needle-export --target`; `--graph
//! accelerator` on the CPU, the only provider here that runs them): raw mode reproduces
//! upstream's greedy generations of both generations (prompts of 82–187 tokens, two to
//! three 64-token prefill chunks, then 32 decode steps through the fixed-capacity cache),
//! from a `.cact` (in memory and through the graph cache) and from the exported pair; a
//! prompt and budget longer than the cache is one error line.

mod support;

use exporter::model::NeedleModel;
use exporter::output::ExportFiles;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AcceleratorTarget, MatMulWeights, Precision, RuntimeTarget};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use support::generate_refs;
use test_support::{fixture, scratch, GENERATING_MODELS as MODELS};

fn run(args: &[&str], cache: Option<&Path>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_needle-run"));
    command.args(args).env("RUST_BACKTRACE", "1");
    match cache {
        Some(dir) => command.env("NEEDLE_ONNX_CACHE", dir),
        None => command.arg("--no-cache"),
    };
    command.output().unwrap()
}

/// `model`'s accelerator pair written as `needle-export --target tensorrt` writes it.
fn export_pair(model: &str, out: &Path) {
    let exported = NeedleModel::read(&fixture(&format!("{model}.cact"))).unwrap();
    let tokenizer = NeedleTokenizer::from_spec(&exported.tokenizer, true).unwrap();
    ExportFiles::accelerator(out, AcceleratorTarget::TensorRt)
        .write(
            &exported,
            &tokenizer,
            Precision::Fp32,
            MatMulWeights::Float,
            RuntimeTarget::Since1_24,
        )
        .unwrap();
}

/// Raw mode's `--json` answer to upstream's prompt `r` with `extra` arguments.
fn raw(model_args: &[&str], r: &Value, cache: Option<&Path>) -> Value {
    let prompt = r["prompt"].as_str().unwrap();
    let args = [
        model_args,
        &["--provider", "cpu", "--raw", prompt, "--json"],
        &["--max-new-tokens", "32"],
    ]
    .concat();
    let o = run(&args, cache);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn raw_mode_on_the_accelerator_graphs_reproduces_upstream_generations() {
    let dir = scratch("accelerator-run");
    let cache = dir.join("graph-cache");
    let (mut longest, mut chunked) = (0, 0);
    for model in MODELS {
        let cact = fixture(&format!("{model}.cact")).display().to_string();
        let onnx = dir.join(format!("{}.onnx", model.replace('/', "-")));
        export_pair(model, &onnx);
        let onnx = onnx.display().to_string();
        let from_cact = ["--model", &cact, "--graph", "accelerator"];
        for r in generate_refs(model) {
            let runs = [
                (&from_cact[..], None),
                (&from_cact[..], Some(cache.as_path())),
                (&from_cact[..], Some(cache.as_path())),
                (&["--model", &onnx][..], None),
            ];
            for (args, cache) in runs {
                let got = raw(args, &r, cache);
                let what = format!("{model} {args:?} cache {cache:?}");
                assert_eq!(got["prompt_ids"], r["prompt_ids"], "{what}");
                assert_eq!(got["generated_ids"], r["generated_ids"], "{what}");
                assert_eq!(got["text"], r["generated_text"], "{what}");
            }
            let prompt = r["prompt_ids"].as_array().unwrap().len();
            longest = longest.max(prompt);
            chunked += usize::from(prompt > 2 * 64);
            let generated = r["generated_ids"].as_array().unwrap().len();
            assert!(
                generated >= 32 || r["stopped_on_eos"] == true,
                "{model}: {generated} tokens"
            );
        }
    }
    assert!(longest > 128 && chunked >= 4, "{longest} {chunked}");
    let cached: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        cached
            .iter()
            .any(|n| n.ends_with(".accelerator-coreml.prefill.onnx")),
        "{cached:?}"
    );
}

#[test]
fn a_prompt_and_budget_past_the_cache_is_one_error_line() {
    let r = &generate_refs("m64")[0];
    let prompt = r["prompt"].as_str().unwrap();
    let cact = fixture("m64.cact").display().to_string();
    // 108 prompt tokens and 200 more do not fit m64's 256 positions.
    let args = [
        "--model",
        &cact,
        "--provider",
        "cpu",
        "--graph",
        "accelerator",
        "--raw",
        prompt,
        "--max-new-tokens",
        "200",
    ];
    let o = run(&args, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("308 positions") && err.contains("256"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_accelerator_graphs_refuse_what_they_cannot_be() {
    let cact = fixture("m64.cact").display().to_string();
    for extra in [&["--precision", "fp16"][..], &["--weights", "packed"][..]] {
        let args = [
            &[
                "--model",
                &cact,
                "--provider",
                "cpu",
                "--graph",
                "accelerator",
            ][..],
            extra,
            &["--raw", "hello"],
        ]
        .concat();
        let o = run(&args, None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?}");
        assert!(err.contains("--graph stock"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}
