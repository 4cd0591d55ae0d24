//! The files of one export, put in place all together or not at all. Each file is
//! written to a new temporary in its destination folder (so that putting it in place is
//! a rename on one file system) and synced; only when every one is written are they
//! renamed over their destinations, one after another with nothing in between that can
//! fail for want of space. On any error before that (ENOSPC, EIO, EFBIG, permissions),
//! and on SIGINT/SIGTERM ([`super::interrupt`]), the temporaries and any folder the
//! export created are removed, and what was at the destinations is untouched.

use super::interrupt::{self, pending};
use super::target;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A test seam, read once per staged file: this many milliseconds of pause after each
/// temporary is written, so that a test can deliver a real signal while a partial set of
/// temporaries exists (the fixtures write in microseconds).
const PAUSE_ENV: &str = "NEEDLE_EXPORT_TEST_PAUSE_MS";

/// A set of temporaries waiting to be put in place.
#[derive(Default)]
pub struct Staging {
    /// `(temporary, destination)` in the order they were staged.
    files: Vec<(PathBuf, PathBuf)>,
    /// Folders this export created, outermost first.
    created_dirs: Vec<PathBuf>,
    committed: bool,
}

impl Staging {
    /// Creates `dir` and any missing folder above it, each removed again unless the
    /// export completes.
    pub fn create_dir_all(&mut self, dir: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut level = Some(dir);
        while let Some(d) = level.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            missing.push(d.to_path_buf());
            level = d.parent();
        }
        for d in missing.into_iter().rev() {
            let mut registry = pending();
            std::fs::create_dir(&d)
                .with_context(|| format!("{}: cannot create the folder", d.display()))?;
            registry.push(d.clone());
            self.created_dirs.push(d);
        }
        Ok(())
    }

    /// Writes `bytes` to a new temporary beside `dest`, synced to disk.
    pub fn stage(&mut self, dest: &Path, bytes: &[u8]) -> Result<()> {
        self.stage_with(dest, |file| file.write_all(bytes).map(|()| bytes.len()))?;
        Ok(())
    }

    /// Writes what `write` writes (returning its length) to a new temporary beside `dest`,
    /// synced to disk; returns that length.
    pub fn stage_with(
        &mut self,
        dest: &Path,
        write: impl FnOnce(&mut File) -> std::io::Result<usize>,
    ) -> Result<usize> {
        let (temp, mut file) =
            create_temporary(dest).with_context(|| format!("{}: cannot write", dest.display()))?;
        self.files.push((temp.clone(), dest.to_path_buf()));
        let len = write(&mut file)
            .and_then(|len| file.sync_all().map(|()| len))
            .with_context(|| format!("{}: cannot write", dest.display()))?;
        pause_for_tests();
        Ok(len)
    }

    /// Puts every staged file in place. Each destination is checked again first (nothing,
    /// or a regular file), so nothing that appeared there meanwhile is replaced.
    pub fn commit(mut self) -> Result<()> {
        let mut registry = pending();
        for (_, dest) in &self.files {
            target::inspect(dest)?;
        }
        for (i, (temp, dest)) in self.files.iter().enumerate() {
            if let Err(e) = std::fs::rename(temp, dest) {
                let done: Vec<String> = self.files[..i]
                    .iter()
                    .map(|(_, d)| d.display().to_string())
                    .collect();
                return Err(e).with_context(|| {
                    format!(
                        "{}: cannot put in place (already in place: {})",
                        dest.display(),
                        if done.is_empty() {
                            "none".into()
                        } else {
                            done.join(", ")
                        }
                    )
                });
            }
        }
        registry.clear();
        self.committed = true;
        for dir in self.files.iter().filter_map(|(_, d)| d.parent()) {
            sync_dir(dir);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let mut registry = pending();
        let temps = self.files.iter().map(|(t, _)| t);
        for path in temps.rev().chain(self.created_dirs.iter().rev()) {
            interrupt::remove(path);
            registry.retain(|p| p != path);
        }
    }
}

/// A new file `.NAME.tmpPID[.N]` beside `dest`, registered for removal on a signal.
/// `create_new` never opens an existing file, so a link planted at that name is not
/// followed.
fn create_temporary(dest: &Path) -> std::io::Result<(PathBuf, File)> {
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = dest
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?
        .to_string_lossy();
    let pid = std::process::id();
    let mut registry = pending();
    let mut attempt = 0u32;
    loop {
        let suffix = if attempt == 0 {
            String::new()
        } else {
            format!(".{attempt}")
        };
        let temp = dir.join(format!(".{name}.tmp{pid}{suffix}"));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => {
                registry.push(temp.clone());
                return Ok((temp, file));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(e),
        }
    }
}

/// Makes the renames into `dir` durable; a file system that cannot sync a folder loses
/// nothing the renames did not already risk.
fn sync_dir(dir: &Path) {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

fn pause_for_tests() {
    let millis = std::env::var(PAUSE_ENV).ok().and_then(|v| v.parse().ok());
    if let Some(millis) = millis {
        std::thread::sleep(std::time::Duration::from_millis(millis));
    }
}
