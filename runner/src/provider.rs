//! Execution provider selection: `--provider` to a session builder with exactly that provider
//! registered (what each provider prefers to run is in `plan`).
//!
//! Every provider is registered with `error_on_failure`, so a provider that cannot be used is
//! an error, never a silent CPU run. Each attempt gets a fresh builder, so a failed
//! registration leaves nothing behind in the builder that is returned.

use graphs::contract::Spelled;
use std::fmt;

use ort::{
    environment::Environment,
    ep,
    session::{
        builder::{AutoDevicePolicy, GraphOptimizationLevel, SessionBuilder},
        Session,
    },
};

/// An onnxruntime execution provider, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// The first of TensorRT, CUDA, CoreML, CPU that registers.
    Auto,
    /// onnxruntime's CPU provider (MLAS), and nothing else.
    Cpu,
    /// NVIDIA CUDA.
    Cuda,
    /// NVIDIA TensorRT, with CUDA for the nodes TensorRT does not take.
    TensorRt,
    /// Apple CoreML.
    CoreMl,
}

impl Spelled for Provider {
    const WHAT: &'static str = "execution provider";
    const ALL: &'static [Self] = &[
        Provider::Auto,
        Provider::Cpu,
        Provider::Cuda,
        Provider::TensorRt,
        Provider::CoreMl,
    ];

    /// The command-line name, also in the JSON answers.
    fn name(self) -> &'static str {
        match self {
            Provider::Auto => "auto",
            Provider::Cpu => "cpu",
            Provider::Cuda => "cuda",
            Provider::TensorRt => "tensorrt",
            Provider::CoreMl => "coreml",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A provider that could not be registered, and onnxruntime's reason.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// The provider that failed; never `Auto`.
    pub provider: Provider,
    /// onnxruntime's message.
    pub reason: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "execution provider {} is unavailable: {}",
            self.provider, self.reason
        )
    }
}

/// Why no session builder could be configured.
#[derive(Debug)]
pub enum ProviderError {
    /// The requested provider (or, with fallback, CPU too) could not be registered.
    Unavailable(Unavailable),
    /// onnxruntime refused the session options themselves.
    Builder(ort::Error),
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(unavailable) => unavailable.fmt(f),
            Self::Builder(e) => write!(f, "cannot configure the onnxruntime session: {e}"),
        }
    }
}

impl std::error::Error for ProviderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(_) => None,
            Self::Builder(e) => Some(e),
        }
    }
}

/// A session builder with one provider registered.
#[derive(Clone)]
pub struct Registered {
    /// Ready for `commit_from_file` / `commit_from_memory`.
    pub builder: SessionBuilder,
    /// The provider that registered; never `Auto`.
    pub provider: Provider,
    /// Providers tried before it, in order, and why each failed.
    pub skipped: Vec<Unavailable>,
    /// The intra-op thread count the builder was given (0: onnxruntime's choice).
    pub threads: usize,
}

/// Configures a session builder for `requested`, with [`tuned_builder`]'s threads and
/// optimization level.
///
/// `Auto` tries TensorRT, CUDA, CoreML, then CPU, and returns the first that registers. A
/// named provider that cannot be registered is an error, unless `fallback` is set: then CPU is
/// registered instead and the named provider's failure is in [`Registered::skipped`].
/// `threads` is the intra-op thread count; 0 lets onnxruntime choose.
pub fn session_builder(
    environment: &Environment,
    requested: Provider,
    fallback: bool,
    threads: usize,
) -> Result<Registered, ProviderError> {
    let (first_tries, last_try) = match requested {
        Provider::Auto => (
            &[Provider::TensorRt, Provider::Cuda, Provider::CoreMl][..],
            Provider::Cpu,
        ),
        Provider::Cpu => (&[][..], Provider::Cpu),
        _ if fallback => (std::slice::from_ref(&requested), Provider::Cpu),
        named => (&[][..], named),
    };
    register_domain_once(environment).map_err(ProviderError::Builder)?;
    let attempt = |provider| {
        let builder = tuned_builder(environment, threads).map_err(ProviderError::Builder)?;
        register(builder, provider)
            .map_err(|reason| ProviderError::Unavailable(Unavailable { provider, reason }))
    };
    let mut skipped = Vec::new();
    for &provider in first_tries {
        match attempt(provider) {
            Ok(builder) => {
                return Ok(Registered {
                    builder,
                    provider,
                    skipped,
                    threads,
                })
            }
            Err(ProviderError::Unavailable(unavailable)) => skipped.push(unavailable),
            Err(e) => return Err(e),
        }
    }
    Ok(Registered {
        builder: attempt(last_try)?,
        provider: last_try,
        skipped,
        threads,
    })
}

/// A session builder with every graph optimization on and `threads` intra-op threads
/// (0 lets onnxruntime choose), with no provider registered yet.
pub fn tuned_builder(environment: &Environment, threads: usize) -> ort::Result<SessionBuilder> {
    Ok(Session::builder(environment)?
        .with_optimization_level(GraphOptimizationLevel::All)?
        .with_intra_threads(threads)?
        .with_operators(crate::needle_ops::domain()?)?)
}

/// Creates one session with the Needle domain before any other, once per process.
///
/// Creating a session that has a custom domain adds the domain to onnx's process-wide
/// table of domain versions, checking first whether it is there, without a lock: two
/// threads creating their first sessions at once can both find it missing, and the second
/// session then fails ("the domain is already exist"). After this first session the domain
/// is in the table, so later sessions only find it.
fn register_domain_once(environment: &Environment) -> ort::Result<()> {
    static REGISTERED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut registered = REGISTERED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !*registered {
        tuned_builder(environment, 1)?.commit_from_memory(&crate::needle_ops::sinkhorn_model())?;
        *registered = true;
    }
    Ok(())
}

fn register(builder: SessionBuilder, provider: Provider) -> Result<SessionBuilder, String> {
    let providers = match provider {
        Provider::Auto | Provider::Cpu => {
            return builder
                .with_auto_device(AutoDevicePolicy::PreferCPU)
                .map_err(|e| e.to_string().trim().to_owned());
        }
        Provider::Cuda => vec![cuda()],
        Provider::TensorRt => vec![ep::TensorRT::default().build(), cuda()],
        Provider::CoreMl => vec![ep::CoreML::default().build()],
    };
    builder
        .with_execution_providers(
            providers
                .into_iter()
                .map(ep::ExecutionProviderDispatch::error_on_failure)
                .collect::<Vec<_>>(),
        )
        .map_err(|e| e.to_string().trim().to_owned())
}

/// The CUDA provider with TF32 off: onnxruntime enables it by default, and TF32 matmuls
/// put fp32 graphs 7e-4 off upstream on an H200, past the contract's 1e-4.
fn cuda() -> ep::ExecutionProviderDispatch {
    ep::CUDA::default().with_tf32(false).build()
}

impl serde::Serialize for Provider {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}
