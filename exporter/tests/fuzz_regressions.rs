//! Replays every input under `tests/fuzz_regressions/` (minimized crashes the
//! `cargo fuzz` targets found; see `fuzz/README.md`) through every target's calls,
//! the same code the fuzzer runs: a file may be rejected, but nothing may
//! panic or hold more heap than the targets allow.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

#[allow(dead_code)]
#[path = "../../fuzz/src/lib.rs"]
mod harness;

#[global_allocator]
static ALLOC: harness::peak::PeakAlloc = harness::peak::PeakAlloc;

#[test]
fn fuzz_regressions_do_not_panic() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_none_or(|e| e != "md"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no inputs in {}", dir.display());

    let targets = [
        ("cact", harness::cact_target as fn(&[u8])),
        ("tokenizer_blob", harness::tokenizer_blob_target),
        ("needle3_export", harness::needle3_export_target),
    ];
    let mut failures = Vec::new();
    for path in &paths {
        let data = std::fs::read(path).unwrap();
        for (target, run) in targets {
            if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
                failures.push(format!("{target}: {}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "panicked on:\n{}", failures.join("\n"));
}
