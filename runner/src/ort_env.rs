//! Finds the onnxruntime shared library and creates the process-wide `ort` environment.
//!
//! The library comes from the `onnxruntime` wheel that `scripts/setup` installs into the
//! project venv, so nobody has to export anything: `ORT_DYLIB_PATH` wins when set, otherwise
//! `.venv/lib/python3*/site-packages/onnxruntime/capi/` is searched in the repository this
//! crate was built from and in every folder above the running executable.

use std::{
    env, fmt, fs,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock, PoisonError},
};

use ort::environment::Environment;

/// File name of the onnxruntime library inside the pinned wheel.
#[cfg(target_os = "macos")]
pub const ORT_LIBRARY: &str = "libonnxruntime.1.32.0.dylib";
/// File name of the onnxruntime library inside the pinned wheel.
#[cfg(not(target_os = "macos"))]
pub const ORT_LIBRARY: &str = "libonnxruntime.so.1.32.0";

/// Environment variable naming the onnxruntime library explicitly.
pub const ORT_DYLIB_PATH: &str = "ORT_DYLIB_PATH";

/// Why the onnxruntime environment could not be created.
#[derive(Debug)]
pub enum OrtEnvError {
    /// No library at `ORT_DYLIB_PATH` nor in any project venv.
    NotFound,
    /// `ORT_DYLIB_PATH` names a file that does not exist.
    MissingOverride(PathBuf),
    /// The library was found but could not be loaded, or its version is older than `ort` needs.
    Load(ort::LoadDynamicError),
    /// onnxruntime refused to create the environment.
    Environment(ort::Error),
}

impl fmt::Display for OrtEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFound => write!(
                f,
                "onnxruntime library not found; run scripts/setup or set {ORT_DYLIB_PATH}"
            ),
            Self::MissingOverride(path) => {
                write!(f, "{ORT_DYLIB_PATH}={} does not exist", path.display())
            }
            Self::Load(e) => write!(f, "cannot load onnxruntime: {e}"),
            Self::Environment(e) => write!(f, "cannot create the onnxruntime environment: {e}"),
        }
    }
}

impl std::error::Error for OrtEnvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Load(e) => Some(e),
            Self::Environment(e) => Some(e),
            Self::NotFound | Self::MissingOverride(_) => None,
        }
    }
}

static ENVIRONMENT: OnceLock<Environment> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Loads onnxruntime and creates the process-wide environment; later calls return the same one.
///
/// Call it before any other `ort` API: `ort` otherwise loads `libonnxruntime.so` from the
/// loader's search path on first use and panics when it is missing.
pub fn init() -> Result<&'static Environment, OrtEnvError> {
    if let Some(environment) = ENVIRONMENT.get() {
        return Ok(environment);
    }
    let _guard = INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(environment) = ENVIRONMENT.get() {
        return Ok(environment);
    }
    let library = library_path()?;
    let environment = ort::init_from(&library)
        .map_err(OrtEnvError::Load)?
        .with_name("needle-onnx")
        .with_telemetry(false)
        .build()
        .map_err(OrtEnvError::Environment)?;
    Ok(ENVIRONMENT.get_or_init(|| environment))
}

/// The onnxruntime library `init` loads: `ORT_DYLIB_PATH` if set, else the first project venv
/// that holds [`ORT_LIBRARY`].
pub fn library_path() -> Result<PathBuf, OrtEnvError> {
    if let Some(path) = env::var_os(ORT_DYLIB_PATH).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(OrtEnvError::MissingOverride(path))
        };
    }
    let exe = env::current_exe().ok();
    let starts = [
        Some(Path::new(env!("CARGO_MANIFEST_DIR"))),
        exe.as_deref().and_then(Path::parent),
    ];
    let found = starts
        .into_iter()
        .flatten()
        .flat_map(Path::ancestors)
        .find_map(|dir| venv_library(&dir.join(".venv")));
    found.ok_or(OrtEnvError::NotFound)
}

fn venv_library(venv: &Path) -> Option<PathBuf> {
    let mut python_dirs: Vec<PathBuf> = fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
        .map(|entry| entry.path())
        .collect();
    python_dirs.sort();
    python_dirs
        .into_iter()
        .map(|dir| dir.join("site-packages/onnxruntime/capi").join(ORT_LIBRARY))
        .find(|library| library.is_file())
}
