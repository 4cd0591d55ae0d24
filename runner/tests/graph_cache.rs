//! needle-run's graph cache: the first run of a `.cact` writes its exported graph (its
//! weights in a data file beside it) and tokenizer to the cache, later runs load them from
//! there with the same answer; an unusable entry (a damaged graph, missing weights) is
//! exported again; other options or another file get their own entry;
//! `--no-cache` writes nothing.

use std::path::Path;
use std::process::{Command, Output};
use test_support::{fixture, scratch};

fn run(cache: &Path, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_needle-run"))
        .args([
            "--provider",
            "cpu",
            "--raw",
            "hello",
            "--max-new-tokens",
            "6",
            "--json",
        ])
        .args(args)
        .env("NEEDLE_ONNX_CACHE", cache)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn generated(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["generated_ids"].clone()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_cact_is_exported_once_and_loaded_from_the_cache_after() {
    let cache = scratch("graph-cache");
    let m64 = fixture("m64.cact");
    let m64 = m64.to_str().unwrap();
    let first = run(&cache, &["--model", m64]);
    let files = entries(&cache);
    // The graph, its weights beside it (external data) and its tokenizer.
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(".fused.fp32.packed.ort1.24.onnx")),
        "{files:?}"
    );
    let graph = cache.join(files.iter().find(|f| f.ends_with(".onnx")).unwrap());
    let written = std::fs::metadata(&graph).unwrap().modified().unwrap();

    let second = run(&cache, &["--model", m64]);
    assert_eq!(generated(&second), generated(&first));
    assert_eq!(
        std::fs::metadata(&graph).unwrap().modified().unwrap(),
        written
    );
    assert!(
        second.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );

    // A damaged entry is said and replaced.
    std::fs::write(&graph, b"not a graph").unwrap();
    let third = run(&cache, &["--model", m64]);
    assert_eq!(generated(&third), generated(&first));
    assert!(String::from_utf8_lossy(&third.stderr).contains("cached graph is unusable"));
    assert!(std::fs::metadata(&graph).unwrap().len() > 1000);

    // So is an entry whose weights are gone.
    let data = cache.join(files.iter().find(|f| f.ends_with(".onnx.data")).unwrap());
    std::fs::remove_file(&data).unwrap();
    let fourth = run(&cache, &["--model", m64]);
    assert_eq!(generated(&fourth), generated(&first));
    assert!(String::from_utf8_lossy(&fourth.stderr).contains("cached graph is unusable"));
    assert!(data.is_file());

    // Other options and another file are other entries.
    run(&cache, &["--model", m64, "--attention", "reference"]);
    let float = run(&cache, &["--model", m64, "--weights", "float"]);
    assert_eq!(generated(&float), generated(&first));
    let m48 = fixture("m48.cact");
    run(&cache, &["--model", m48.to_str().unwrap()]);
    let graphs_and_tokenizers = entries(&cache)
        .into_iter()
        .filter(|f| !f.ends_with(".data"))
        .count();
    assert_eq!(graphs_and_tokenizers, 8, "{:?}", entries(&cache));

    let untouched = scratch("graph-cache-off");
    let off = run(&untouched, &["--model", m64, "--no-cache"]);
    assert_eq!(generated(&off), generated(&first));
    assert!(entries(&untouched).is_empty());
}
