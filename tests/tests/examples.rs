//! The "Use it from…" snippets (`examples/`), run as they are on exported fixture graphs,
//! reproduce upstream's greedy generations; and `docs/examples.md`, the page the README's
//! "Use it from…" section links to, shows them verbatim.

use exporter::model::NeedleModel;
use exporter::output::ExportFiles;
use exporter::tokenizer::NeedleTokenizer;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget};
use needle_tests::{fixture, generations, python, repo_root, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

const PYTHON_EXAMPLE: &str = "examples/python/greedy.py";
const NODE_EXAMPLE: &str = "examples/node/greedy.mjs";
/// Runs the Node example in headless Chromium (`tests/browser`).
const BROWSER_RUNNER: &str = "tests/browser/run.mjs";
/// Run by `genai.rs`.
const GENAI_EXAMPLE: &str = "examples/genai/generate.py";

/// The page that shows the examples in full: the README's "Use it from…" section is kept
/// short and links here, so this file, not README.md, must hold each example verbatim.
const EXAMPLES_PAGE: &str = "docs/examples.md";

#[test]
fn the_examples_page_shows_the_examples_as_they_are() {
    let page = std::fs::read_to_string(repo_root().join(EXAMPLES_PAGE)).unwrap();
    for example in [PYTHON_EXAMPLE, NODE_EXAMPLE, GENAI_EXAMPLE] {
        let code = std::fs::read_to_string(repo_root().join(example)).unwrap();
        assert!(
            page.contains(&code),
            "{EXAMPLES_PAGE} must contain {example} verbatim"
        );
    }
}

/// Exports fixture `model` (fp32, dense) as `attention` into `dir`, tokenizer beside it.
fn export(dir: &Path, model: &str, attention: AttentionKind) -> PathBuf {
    let out = dir.join(format!("{model}-{attention}.onnx"));
    let exported = NeedleModel::read(&fixture(&format!("{model}.cact"))).unwrap();
    let tokenizer = NeedleTokenizer::from_spec(&exported.tokenizer, true).unwrap();
    ExportFiles::beside(&out, &[attention])
        .write(
            &exported,
            &tokenizer,
            Precision::Fp32,
            MatMulWeights::Float,
            RuntimeTarget::Since1_24,
        )
        .unwrap();
    out
}

/// onnxruntime-node (three models) and onnxruntime-web (wasm, m64) 1.30 (`examples/node`,
/// installed by scripts/setup-tests) on both variants, from upstream's prompt ids.
#[test]
fn the_node_example_reproduces_upstream_generations_in_node_and_web() {
    let dir = scratch("example-node");
    let example = repo_root().join(NODE_EXAMPLE);
    for package in ["onnxruntime-node", "onnxruntime-web"] {
        assert!(
            repo_root()
                .join("examples/node/node_modules")
                .join(package)
                .exists(),
            "examples/node has no {package}: run scripts/setup-tests"
        );
    }
    for model in ["m48", "m64", "m96"] {
        for attention in [AttentionKind::FUSED, AttentionKind::Reference] {
            let graph = export(&dir, model, attention);
            // The wasm build is several times slower: one model is enough for it.
            let web = model == "m64";
            let packages = ["onnxruntime-node", "onnxruntime-web"];
            for package in &packages[..1 + web as usize] {
                for g in generations(model) {
                    let mut node = Command::new("node");
                    node.arg(&example).env("ORT_PACKAGE", package);
                    let ids = node_generation(node, &graph, &g.prompt_ids);
                    assert_eq!(ids, g.generated_ids, "{package} {model} {attention}");
                }
            }
        }
    }
}

/// The same example, unchanged, in a web page: onnxruntime-web's wasm build in headless
/// Chromium (Debian's, driven by playwright-core; both installed by scripts/setup-tests), m64,
/// both variants.
#[test]
fn the_node_example_reproduces_upstream_generations_in_headless_chromium() {
    let dir = scratch("example-browser");
    let chromium = std::env::var_os("CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{} is missing: run scripts/setup-tests",
        chromium.to_string_lossy()
    );
    assert!(
        repo_root()
            .join("tests/browser/node_modules/playwright-core")
            .exists(),
        "tests/browser has no playwright-core: run scripts/setup-tests"
    );
    for attention in [AttentionKind::FUSED, AttentionKind::Reference] {
        let graph = export(&dir, "m64", attention);
        for g in generations("m64") {
            let mut node = Command::new("node");
            node.arg(repo_root().join(BROWSER_RUNNER));
            let ids = node_generation(node, &graph, &g.prompt_ids);
            assert_eq!(ids, g.generated_ids, "chromium m64 {attention}");
        }
    }
}

/// The 32 ids `node` (a script and its environment set) generates after `prompt_ids` with
/// `graph`: the Node example's command line and output.
fn node_generation(mut node: Command, graph: &Path, prompt_ids: &[u32]) -> Vec<u32> {
    let prompt = serde_json::to_string(prompt_ids).unwrap();
    let o = node
        .arg(graph)
        .arg(&prompt)
        .arg("32")
        .output()
        .expect("node runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_python_example_reproduces_upstream_generations() {
    let dir = scratch("example-python");
    for model in ["m48", "m64", "m96"] {
        let out = export(&dir, model, AttentionKind::FUSED);
        let refs: Vec<serde_json::Value> = serde_json::from_str(
            &std::fs::read_to_string(fixture(&format!("{model}.generate.json"))).unwrap(),
        )
        .unwrap();
        for (r, g) in refs.iter().zip(generations(model)) {
            let o = python()
                .arg(repo_root().join(PYTHON_EXAMPLE))
                .arg(&out)
                .arg(r["prompt"].as_str().unwrap())
                .arg("32")
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let stdout = String::from_utf8(o.stdout).unwrap();
            let ids: Vec<u32> = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
            assert_eq!(ids, g.generated_ids, "{model}: {:?}", r["prompt"]);
        }
    }
}
