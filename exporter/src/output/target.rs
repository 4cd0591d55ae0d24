//! What an output path names before an export writes it, and whether the export may put a
//! file there. Only two things may be: nothing yet, or a regular file (replaced only with
//! `--force`). Putting a file in place is a rename, which replaces the directory entry
//! itself, so renaming over a device, a FIFO or a symbolic link would turn `/dev/null` or a
//! link into a regular file: those are refused, `--force` or not. A symbolic link is
//! refused rather than followed, dangling or not: writing through it would put the model
//! wherever the link points, which the user named only indirectly.

use anyhow::{bail, Result};
use std::fs::{FileType, Metadata};
use std::path::Path;

/// What is at an output path now.
pub enum Existing {
    /// Nothing: the export creates the file.
    Nothing,
    /// A regular file, which the export would replace.
    RegularFile(Metadata),
}

/// What `path` names, without following a symbolic link; an error for anything but
/// nothing or a regular file.
pub fn inspect(path: &Path) -> Result<Existing> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(e) => bail!("{}: cannot inspect the output path: {e}", path.display()),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(Existing::RegularFile(meta));
    }
    if kind.is_symlink() {
        let target = std::fs::read_link(path)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        let dangling = if path.exists() { "" } else { "dangling " };
        bail!(
            "{}: is a {dangling}symbolic link (to {target}); needle-export writes only regular \
             files and does not follow links: name the file itself",
            path.display()
        );
    }
    bail!(
        "{}: is {}, not a regular file; needle-export never replaces one, --force or not",
        path.display(),
        describe(kind)
    );
}

/// Whether `a` and `b` are the same file (hard links included).
pub fn same_file(a: &Metadata, b: &Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        a.len() == b.len() && a.modified().ok() == b.modified().ok()
    }
}

/// "a directory", "a character device", …: what a non-regular file is, in words.
fn describe(kind: FileType) -> &'static str {
    if kind.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}
