//! What every crate's tests share and that needs none of the project's crates: where the
//! repository, its fixtures and the project venv's Python are, and fresh scratch
//! directories. Paths come from this crate's own location in the repository, never from
//! where `target/` is.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support sits two levels below the root")
        .to_path_buf()
}

/// The models with upstream greedy generations (`<model>.generate.json`).
pub const GENERATING_MODELS: [&str; 6] = [
    "m48",
    "m64",
    "m96",
    "needle3/n3a",
    "needle3/n3b",
    "needle3/n3c",
];

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

/// The bytes of `tests/fixtures/<name>`.
pub fn read_fixture(name: &str) -> Vec<u8> {
    let path = fixture(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The project venv's Python (`scripts/setup` makes it with onnxruntime; `scripts/setup-tests` adds onnx,
/// sentencepiece, tokenizers and upstream's package.
pub fn python() -> Command {
    python_in(".venv")
}

/// The Python of the venv `name` at the repository root (`scripts/setup-tests` makes `.venv` and
/// one `.venv-ort-<version>` per older onnxruntime the graphs are checked on).
pub fn python_in(name: &str) -> Command {
    let path = repo_root().join(name).join("bin/python");
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup-tests",
        path.display()
    );
    Command::new(path)
}

/// An empty directory for test `name` of this process (removed and made anew).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("needle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}
