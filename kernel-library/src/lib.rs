//! `libneedle_kernels`: the Needle op domain (`needle.CqMatMul`, `needle.Sinkhorn`, as
//! `kernel-ops` defines them) for any onnxruntime that loads custom-op libraries: Python's
//! `SessionOptions.register_custom_ops_library(path)`, C++'s `Ort::SessionOptions::
//! RegisterCustomOpsLibrary`, C#'s `SessionOptions.RegisterCustomOpLibrary`, the C API's
//! `RegisterCustomOpsLibrary_V2`. Each of them calls [`RegisterCustomOps`] once per
//! session options.
//!
//! The library links no onnxruntime: every call goes through the `OrtApi` the host hands
//! over, so the kernels run inside the host's own onnxruntime (its thread pool, its
//! tensors) and a second onnxruntime is never loaded.

mod custom_op;
mod host;

pub use host::{run, Api, Constants};
use ort_sys::{OrtApiBase, OrtErrorCode, OrtSessionOptions, OrtStatus};
use std::ffi::CStr;

/// The C API level asked of the host: 17, onnxruntime 1.17, the oldest release this
/// library works with. It needs `KernelContext_ParallelFor` (API 17) to run row blocks on
/// the session's threads and `CreateKernelV2`/`KernelComputeV2` (API 16) to return a
/// kernel's errors as statuses; everything else it calls is API 1. Each op declares this
/// version too, so onnxruntime reads none of `OrtCustomOp`'s later fields.
pub const API_VERSION: u32 = 17;

/// Adds the `needle` domain to `options`. onnxruntime calls it when the library is
/// registered; the domain and its ops live for the rest of the process (a session keeps
/// pointers to them, and no call tells the library when the last session has ended).
///
/// # Safety
/// `options` and `api_base` are what onnxruntime passes: its session options and its own
/// `OrtApiBase`.
#[no_mangle]
pub unsafe extern "system" fn RegisterCustomOps(
    options: *mut OrtSessionOptions,
    api_base: *const OrtApiBase,
) -> *mut OrtStatus {
    // SAFETY: onnxruntime passes its own OrtApiBase, which lives as long as it is loaded.
    // A null one leaves nothing to report an error through.
    let Some(base) = (unsafe { api_base.as_ref() }) else {
        return std::ptr::null_mut();
    };
    // SAFETY: GetApi takes any version and answers null for one the host does not have;
    // an answer points at the host's static OrtApi.
    let Some(api) = (unsafe { (base.GetApi)(API_VERSION).as_ref() }) else {
        return too_old(base);
    };
    let api = Api::new(api);
    api.guarded(
        || "RegisterCustomOps".into(),
        || unsafe {
            // SAFETY: `options` is the host's session options, as this function requires.
            custom_op::add_domain(&api, options)
        },
    )
    .0
}

/// The error of a host older than [`API_VERSION`], through the API level every
/// onnxruntime has (1), since the one asked for is missing.
fn too_old(base: &OrtApiBase) -> *mut OrtStatus {
    // SAFETY: GetVersionString answers a static NUL-terminated string; GetApi(1) the host's
    // OrtApi, whose CreateStatus copies the message.
    unsafe {
        let version = CStr::from_ptr((base.GetVersionString)()).to_string_lossy();
        let message = format!(
            "libneedle_kernels needs onnxruntime 1.17 or later (C API {API_VERSION}); \
             this is {version}\0"
        );
        match (base.GetApi)(1).as_ref() {
            Some(api) => (api.CreateStatus)(OrtErrorCode::ORT_FAIL, message.as_ptr().cast()).0,
            // Every onnxruntime has API 1; without it there is no status to answer with.
            None => std::ptr::null_mut(),
        }
    }
}
