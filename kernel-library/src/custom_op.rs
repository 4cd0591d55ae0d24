//! Each Needle op as the C API's `OrtCustomOp`, and the `needle` domain that holds them.
//!
//! The op structs are built once and never freed: a domain points at them, and every
//! session created from options holding that domain points at them until it ends, which
//! the library is never told. Each `RegisterCustomOps` call makes a domain of its own
//! (with that host's API) and never releases it, for the same reason.

use crate::host::{ort_type, run, Api, Constants};
use crate::API_VERSION;
use kernel_ops::{op_error, NeedleOp, Presence, Registry, DOMAIN, OUTPUT_TYPE};
use ort_sys::{
    ONNXTensorElementDataType as OrtType, OrtApi, OrtCustomOp,
    OrtCustomOpInputOutputCharacteristic as Characteristic, OrtKernelContext, OrtKernelInfo,
    OrtMemType, OrtSessionOptions, OrtStatusPtr,
};
use std::convert::Infallible;
use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

/// One op: the C struct onnxruntime reads, then its NUL-terminated name. `repr(C)` puts
/// `op` at offset 0, so the `*const OrtCustomOp` onnxruntime passes back to a callback
/// also points at the whole `NeedleCustomOp`.
#[repr(C)]
struct NeedleCustomOp {
    op: OrtCustomOp,
    name: CString,
}

/// Adds a new `needle` domain with every op to `options`.
///
/// # Safety
/// `options` is the host's live session options.
pub unsafe fn add_domain(api: &Api, options: *mut OrtSessionOptions) -> Result<(), String> {
    let raw = api.raw();
    let name = CString::new(DOMAIN).expect("the domain name has no NUL");
    let mut domain = std::ptr::null_mut();
    // SAFETY: CreateCustomOpDomain copies the name; the domain is added to `options`
    // below, or released on failure.
    api.check(unsafe { (raw.CreateCustomOpDomain)(name.as_ptr(), &mut domain) })?;
    let added = ops().iter().try_for_each(|op| {
        // SAFETY: `domain` is live; `op` is static, as the domain needs.
        api.check(unsafe { (raw.CustomOpDomain_Add)(domain, &op.op) })
    });
    // SAFETY: `options` is live (the caller's promise); `domain` is not released after
    // this: sessions of `options` read it for as long as they live.
    let added = added.and_then(|()| api.check(unsafe { (raw.AddCustomOpDomain)(options, domain) }));
    if added.is_err() {
        // SAFETY: the domain reached no session options, so nothing else holds it.
        unsafe { (raw.ReleaseCustomOpDomain)(domain) };
    }
    added
}

/// Every op of the domain, built on first use and kept for the process.
fn ops() -> &'static [NeedleCustomOp] {
    static OPS: OnceLock<Vec<NeedleCustomOp>> = OnceLock::new();
    OPS.get_or_init(|| {
        let mut ops = Ops(Vec::new());
        let Ok(()) = kernel_ops::register_all(&mut ops);
        ops.0
    })
}

/// Collects the ops `kernel_ops::register_all` hands over.
struct Ops(Vec<NeedleCustomOp>);

impl Registry for Ops {
    type Error = Infallible;

    fn add<Op: NeedleOp>(&mut self) -> Result<(), Infallible> {
        // SAFETY: every field of OrtCustomOp is an integer or an optional function
        // pointer, for which all-zero bits are 0 and None; the ones onnxruntime calls at
        // API 17 are set below, the rest stay None.
        let mut op: OrtCustomOp = unsafe { std::mem::zeroed() };
        op.version = API_VERSION;
        op.GetName = Some(name);
        op.GetExecutionProviderType = Some(cpu);
        op.GetInputTypeCount = Some(input_count::<Op>);
        op.GetInputType = Some(input_type::<Op>);
        op.GetOutputTypeCount = Some(output_count::<Op>);
        op.GetOutputType = Some(output_type);
        op.GetInputCharacteristic = Some(input_characteristic::<Op>);
        op.GetOutputCharacteristic = Some(output_characteristic::<Op>);
        op.GetVariadicInputMinArity = Some(one);
        op.GetVariadicInputHomogeneity = Some(one);
        op.GetInputMemoryType = Some(cpu_memory);
        op.CreateKernelV2 = Some(create_kernel::<Op>);
        op.KernelComputeV2 = Some(compute::<Op>);
        op.KernelDestroy = Some(destroy::<Op>);
        let name = CString::new(Op::NAME).expect("op names have no NUL");
        self.0.push(NeedleCustomOp { op, name });
        Ok(())
    }
}

// The descriptive callbacks below cannot panic (no indexing, no allocation), so they need
// no guard against unwinding.

unsafe extern "system" fn name(op: *const OrtCustomOp) -> *const c_char {
    // SAFETY: onnxruntime passes back an op of `ops()`, a `NeedleCustomOp` (see its layout).
    unsafe { &*op.cast::<NeedleCustomOp>() }.name.as_ptr()
}

/// None: onnxruntime's CPU execution provider.
unsafe extern "system" fn cpu(_: *const OrtCustomOp) -> *const c_char {
    std::ptr::null()
}

/// The declared inputs: the required, the optional and one for the variadic ones.
unsafe extern "system" fn input_count<Op: NeedleOp>(_: *const OrtCustomOp) -> usize {
    kernel_ops::declared_inputs::<Op>().count()
}

unsafe extern "system" fn input_type<Op: NeedleOp>(_: *const OrtCustomOp, index: usize) -> OrtType {
    kernel_ops::declared_inputs::<Op>()
        .nth(index)
        .map_or(OrtType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, ort_type)
}

unsafe extern "system" fn input_characteristic<Op: NeedleOp>(
    _: *const OrtCustomOp,
    index: usize,
) -> Characteristic {
    characteristic(Presence::of_input::<Op>(index))
}

unsafe extern "system" fn output_count<Op: NeedleOp>(_: *const OrtCustomOp) -> usize {
    Op::OUTPUTS + Op::OPTIONAL_OUTPUTS
}

unsafe extern "system" fn output_type(_: *const OrtCustomOp, _: usize) -> OrtType {
    ort_type(OUTPUT_TYPE)
}

unsafe extern "system" fn output_characteristic<Op: NeedleOp>(
    _: *const OrtCustomOp,
    index: usize,
) -> Characteristic {
    characteristic(Presence::of_output::<Op>(index))
}

fn characteristic(presence: Presence) -> Characteristic {
    match presence {
        Presence::Required => Characteristic::INPUT_OUTPUT_REQUIRED,
        Presence::Optional => Characteristic::INPUT_OUTPUT_OPTIONAL,
        Presence::Variadic => Characteristic::INPUT_OUTPUT_VARIADIC,
    }
}

/// A variadic input takes at least one tensor, all of one type.
unsafe extern "system" fn one(_: *const OrtCustomOp) -> std::ffi::c_int {
    1
}

unsafe extern "system" fn cpu_memory(_: *const OrtCustomOp, _: usize) -> OrtMemType {
    OrtMemType::OrtMemTypeDefault
}

/// One node's kernel: its op and the API of the host that created it.
struct HostKernel<Op> {
    op: Op,
    constants: Constants,
    api: Api,
}

unsafe extern "system" fn create_kernel<Op: NeedleOp>(
    _: *const OrtCustomOp,
    api: *const OrtApi,
    info: *const OrtKernelInfo,
    kernel: *mut *mut c_void,
) -> OrtStatusPtr {
    // SAFETY: onnxruntime passes its own static OrtApi at the op's version.
    let api = Api::new(unsafe { &*api });
    api.guarded(op_name::<Op>, || {
        // SAFETY: `info` is the kernel info of the node being created.
        let op = Op::new(&|name| unsafe { api.attribute(info, name) })?;
        // SAFETY: as above; the constants live in the kernel, which onnxruntime destroys
        // before the session's initializers.
        let constants = unsafe { api.constants::<Op>(info) }.map_err(op_error::<Op>)?;
        let created = Box::into_raw(Box::new(HostKernel { op, constants, api }));
        // SAFETY: `kernel` is where onnxruntime takes the new kernel from; it hands it
        // back to `compute` and, once, to `destroy`.
        unsafe { *kernel = created.cast() };
        Ok(())
    })
}

unsafe extern "system" fn compute<Op: NeedleOp>(
    kernel: *mut c_void,
    ctx: *mut OrtKernelContext,
) -> OrtStatusPtr {
    // SAFETY: `kernel` is a `HostKernel<Op>` from `create_kernel`, not yet destroyed.
    let kernel = unsafe { &*kernel.cast::<HostKernel<Op>>() };
    let api = kernel.api;
    // SAFETY: `ctx` is the context of this compute call.
    api.guarded(op_name::<Op>, || unsafe {
        run(api, &kernel.op, &kernel.constants, ctx)
    })
}

/// `needle.<op>`, for a panic's message.
fn op_name<Op: NeedleOp>() -> String {
    format!("{DOMAIN}.{}", Op::NAME)
}

unsafe extern "system" fn destroy<Op: NeedleOp>(kernel: *mut c_void) {
    if kernel.is_null() {
        return;
    }
    // SAFETY: `kernel` is a `HostKernel<Op>` from `create_kernel`, handed back once.
    let kernel = unsafe { Box::from_raw(kernel.cast::<HostKernel<Op>>()) };
    // A panicking drop would unwind into onnxruntime; there is no status to report it
    // through, so it is dropped here.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(kernel)));
}
