//! SIGINT and SIGTERM during an export: every temporary file (and folder) the export
//! created so far is removed, then the process dies of the signal as if it had not been
//! handled, so the caller sees the interruption. Without this, an interrupted write left
//! hidden `.OUT.onnx.tmp<PID>` files of any size behind.
//!
//! The paths live in one registry. A temporary is created and registered while the
//! registry is locked, and the files are put in place while it is locked, so the handler
//! (which takes the lock and never gives it back) sees either the whole set of
//! temporaries or none of them.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The registry of temporaries to remove on a signal, locked.
pub(super) fn pending() -> MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a registered path: a temporary file, or a folder the export created (only
/// if it is empty by then).
pub(super) fn remove(path: &std::path::Path) {
    if std::fs::remove_file(path).is_err() {
        let _ = std::fs::remove_dir(path);
    }
}

/// Installs the SIGINT/SIGTERM handling (a thread that waits for either signal).
/// `needle-export` calls it once at start; a library caller that wants its own signal
/// handling leaves it out (its temporaries are still removed on every error).
#[cfg(unix)]
pub fn remove_temporaries_on_signal() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::iterator::Signals;
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let pending = pending();
            for path in pending.iter().rev() {
                remove(path);
            }
            let _ = signal_hook::low_level::emulate_default_handler(signal);
            std::process::exit(128 + signal);
        }
    });
    Ok(())
}

/// Signals are a Unix notion; elsewhere the default handling stays.
#[cfg(not(unix))]
pub fn remove_temporaries_on_signal() -> std::io::Result<()> {
    Ok(())
}
