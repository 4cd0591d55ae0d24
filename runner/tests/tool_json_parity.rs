//! The tool list is written into the prompt exactly as upstream's Python writes it:
//! `json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)`, on a corpus
//! `tests/python/make_json_corpus.py` generates (integers beyond 64 bits, `1E400`, `-0`,
//! `NaN`/`Infinity`, escapes, surrogates, repeated keys, damaged texts), compared with
//! what the venv's Python makes of each text.

use runner::prompt::render_prompt;
use runner::python_json::loads;
use serde_json::Value;
use std::process::Command;
use test_support::{python, repo_root, scratch};

#[test]
fn every_text_renders_as_python_renders_it_and_python_refusals_are_refused() {
    let out = python()
        .arg(repo_root().join("tests/python/make_json_corpus.py"))
        .args(["4000", "13"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut accepted = 0;
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let text = case["text"].as_str().unwrap();
        let ours = loads(text).map(|v| v.dumps_compact());
        match case["dumps"].as_str() {
            Some(python) => {
                accepted += 1;
                assert_eq!(ours.as_deref(), Ok(python), "{text:?}");
            }
            None => assert!(ours.is_err(), "Python refuses {text:?}; we gave {ours:?}"),
        }
    }
    assert!(accepted > 2000, "only {accepted} texts were valid JSON");
}

#[test]
fn needle_run_reads_tools_as_python_does() {
    let dir = scratch("tool-json");
    let tools = dir.join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"name": "f", "parameters": {"big": 123456789012345678901234567890, "inf": 1E400, "ninf": -1e999, "nan": NaN}}]"#,
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_needle-run"))
        .arg("--tools")
        .arg(&tools)
        .args([
            "--provider",
            "cpu",
            "--query",
            "hi",
            "--max-new-tokens",
            "1",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rendered = loads(&std::fs::read_to_string(&tools).unwrap())
        .unwrap()
        .dumps_compact();
    assert_eq!(
        rendered,
        r#"[{"name":"f","parameters":{"big":123456789012345678901234567890,"inf":Infinity,"ninf":-Infinity,"nan":NaN}}]"#
    );
    let prompt = render_prompt(&Value::String(rendered.clone()), "hi", None);
    assert!(prompt.contains(&format!("<tools>{rendered}</tools>")));

    std::fs::write(&tools, "[{\"name\": \"f\"}] x").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_needle-run"))
        .arg("--tools")
        .arg(&tools)
        .args(["--provider", "cpu", "--query", "hi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("extra data at line 1 column 17"), "{err}");
}
