//! Where `needle-export` writes: only to nothing yet or a regular file, never through or
//! over a link, device, FIFO or folder (`--force` or not); all files of one export or
//! none, on a write failure and on SIGINT/SIGTERM alike, with what was there untouched.

use std::os::unix::fs::{symlink, FileTypeExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use test_support::{fixture, scratch};

const EXPORT: &str = env!("CARGO_BIN_EXE_needle-export");

fn export(args: &[&Path]) -> Output {
    Command::new(EXPORT).args(args).output().unwrap()
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Exit 1 and exactly one stderr line containing `says`.
fn assert_one_line_error(o: &Output, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(says), "wanted {says:?} in: {err}");
}

/// A directory with an existing export set `out.onnx` + `out.tokenizer.json`.
fn with_old_set(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let out = dir.join("out.onnx");
    std::fs::write(&out, b"old graph").unwrap();
    std::fs::write(dir.join("out.tokenizer.json"), b"old tokenizer").unwrap();
    (dir, out)
}

fn assert_old_set_untouched(dir: &Path) {
    assert_eq!(listing(dir), ["out.onnx", "out.tokenizer.json"]);
    assert_eq!(std::fs::read(dir.join("out.onnx")).unwrap(), b"old graph");
    let tokenizer = std::fs::read(dir.join("out.tokenizer.json")).unwrap();
    assert_eq!(tokenizer, b"old tokenizer");
}

#[test]
fn links_fifos_devices_and_folders_are_refused_with_or_without_force() {
    let dir = scratch("dest-kinds");
    let fifo = dir.join("fifo.onnx");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let regular = dir.join("regular.onnx");
    std::fs::write(&regular, b"keep").unwrap();
    let link = dir.join("link.onnx");
    symlink(&regular, &link).unwrap();
    let dangling = dir.join("dangling.onnx");
    symlink(dir.join("nowhere.onnx"), &dangling).unwrap();
    let folder = dir.join("folder.onnx");
    std::fs::create_dir(&folder).unwrap();
    let before = listing(&dir);
    let cases = [
        (&fifo, "is a named pipe (FIFO)"),
        (&link, "is a symbolic link"),
        (&dangling, "is a dangling symbolic link"),
        (&folder, "is a directory"),
    ];
    for (target, says) in cases {
        for force in [&[][..], &[Path::new("--force")][..]] {
            let o = export(&[&[fixture("m64.cact").as_path(), target][..], force].concat());
            assert_one_line_error(&o, says);
            assert_eq!(listing(&dir), before, "{}", target.display());
        }
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(std::fs::read_link(&link).unwrap(), regular);
    assert_eq!(std::fs::read(&regular).unwrap(), b"keep");
    assert!(std::fs::symlink_metadata(&dangling).unwrap().is_symlink());
    assert_eq!(listing(&folder), Vec::<String>::new());
}

#[test]
fn a_refused_second_file_refuses_the_whole_export() {
    let dir = scratch("dest-second");
    let out = dir.join("out.onnx");
    assert!(Command::new("mkfifo")
        .arg(dir.join("out.tokenizer.json"))
        .status()
        .unwrap()
        .success());
    let o = export(&[&fixture("m64.cact"), &out, Path::new("--force")]);
    assert_one_line_error(&o, "out.tokenizer.json: is a named pipe (FIFO)");
    assert_eq!(listing(&dir), ["out.tokenizer.json"]);
}

/// `/dev/null` is checked with a model that does not exist: the destination is refused
/// before the model is read, so even a broken check could not write anything there.
#[test]
fn a_device_is_refused_before_anything_is_read() {
    let o = export(&[
        Path::new("/nonexistent/model.cact"),
        Path::new("/dev/null"),
        Path::new("--force"),
    ]);
    assert_one_line_error(&o, "/dev/null: is a character device");
    let null = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(null.file_type().is_char_device());
    assert!(!Path::new("/dev/null.tokenizer.json").exists());
}

/// A real write failure on a later file: the file-size limit (`ulimit -f`, with SIGXFSZ
/// ignored so the write fails with EFBIG as on a full disk) lets the 9 kB tokenizer
/// through and stops the 700 kB graph.
#[test]
fn a_write_failure_leaves_nothing_new_and_the_old_set_untouched() {
    let (dir, out) = with_old_set("dest-efbig");
    let limited = |args: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("trap '' XFSZ; ulimit -f 100; exec \"$0\" {args}"))
            .arg(EXPORT)
            .output()
            .unwrap()
    };
    let model = fixture("m64.cact");
    let o = limited(&format!(
        "'{}' '{}' --attention both --force",
        model.display(),
        out.display()
    ));
    assert_one_line_error(&o, "File too large");
    assert_old_set_untouched(&dir);

    let genai = dir.join("new").join("folder");
    let o = limited(&format!(
        "'{}' '{}' --genai",
        model.display(),
        genai.display()
    ));
    assert_one_line_error(&o, "File too large");
    assert_old_set_untouched(&dir);
}

/// A real SIGINT or SIGTERM while the temporaries exist. The fixtures are written in
/// microseconds, so the export is asked to pause after each temporary it writes
/// (`NEEDLE_EXPORT_TEST_PAUSE_MS`); the signal comes as soon as the first one appears.
fn interrupt(signal: &str, args: &[&Path], dir: &Path) -> Output {
    let child = Command::new(EXPORT)
        .args(args)
        .env("NEEDLE_EXPORT_TEST_PAUSE_MS", "2000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let has_temporary = |d: &Path| d.is_dir() && listing(d).iter().any(|n| n.contains(".tmp"));
    while !has_temporary(dir) && !has_temporary(&dir.join("folder")) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no temporary appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap()
        .success());
    child.wait_with_output().unwrap()
}

#[test]
fn sigint_and_sigterm_remove_the_temporaries_and_keep_the_old_set() {
    for (signal, number) in [("INT", 2), ("TERM", 15)] {
        let (dir, out) = with_old_set(&format!("dest-signal-{signal}"));
        let args = [
            fixture("m64.cact"),
            out,
            "--attention".into(),
            "both".into(),
            "--force".into(),
        ];
        let args: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
        let o = interrupt(signal, &args, &dir);
        assert_eq!(o.status.signal(), Some(number), "{o:?}");
        assert_old_set_untouched(&dir);

        let genai = dir.join("folder");
        let args = [&fixture("m64.cact"), genai.as_path(), Path::new("--genai")];
        let o = interrupt(signal, &args, &dir);
        assert_eq!(o.status.signal(), Some(number), "{o:?}");
        assert_old_set_untouched(&dir);
    }
}
