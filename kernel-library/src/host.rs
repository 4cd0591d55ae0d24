//! The host onnxruntime's C API as this library uses it: statuses, attributes, the
//! kernel context's tensors and its thread pool. Every function here is a thin, checked
//! call through the `OrtApi` the host handed over.

use kernel_ops::{op_error, ElementType, Input, InputData, NeedleOp, RowSplit};
use ort_sys::{
    ONNXTensorElementDataType as OrtType, OrtApi, OrtErrorCode, OrtKernelContext, OrtKernelInfo,
    OrtStatusPtr, OrtValue,
};
use std::any::Any;
use std::ffi::{c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// The host's API, at level [`crate::API_VERSION`].
#[derive(Clone, Copy)]
pub struct Api(&'static OrtApi);

impl Api {
    /// `api` is the host's OrtApi: a static table in onnxruntime, alive while it is loaded,
    /// which is as long as this library is.
    pub fn new(api: &'static OrtApi) -> Api {
        Api(api)
    }

    /// Runs `f` for a C callback (`what()` names it): its error, or any panic, comes back
    /// as the host's status, so nothing unwinds into onnxruntime.
    pub fn guarded(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<(), String>,
    ) -> OrtStatusPtr {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => OrtStatusPtr(std::ptr::null_mut()),
            Ok(Err(message)) => self.status(&message),
            Err(panic) => {
                let message = format!("{} panicked: {}", what(), panic_message(&*panic));
                self.status(&message)
            }
        }
    }

    /// A failure status saying `message`.
    fn status(&self, message: &str) -> OrtStatusPtr {
        let message = CString::new(message.replace('\0', " ")).expect("NULs replaced");
        // SAFETY: CreateStatus copies the NUL-terminated message.
        unsafe { (self.0.CreateStatus)(OrtErrorCode::ORT_FAIL, message.as_ptr()) }
    }

    /// `Ok` for a null status; else its message, the status released.
    pub fn check(&self, status: OrtStatusPtr) -> Result<(), String> {
        if status.0.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null status is the host's, alive until released here; its message
        // is NUL-terminated and copied before the release.
        unsafe {
            let message = CStr::from_ptr((self.0.GetErrorMessage)(status.0))
                .to_string_lossy()
                .into_owned();
            (self.0.ReleaseStatus)(status.0);
            Err(message)
        }
    }

    pub fn raw(&self) -> &'static OrtApi {
        self.0
    }

    /// The integer attribute `name` of the node `info` describes, `None` where it has none.
    ///
    /// # Safety
    /// `info` is the host's kernel info of the kernel being created.
    pub unsafe fn attribute(&self, info: *const OrtKernelInfo, name: &str) -> Option<i64> {
        let name = CString::new(name).ok()?;
        let mut value = 0;
        // SAFETY: `info` is valid (the caller's promise); `name` is NUL-terminated.
        let status =
            unsafe { (self.0.KernelInfoGetAttribute_int64)(info, name.as_ptr(), &mut value) };
        self.check(status).ok().map(|()| value)
    }

    /// Input `index` of `ctx`: its shape, and its elements as `t`.
    ///
    /// # Safety
    /// `ctx` is the host's context of the running compute call; the elements are borrowed
    /// from it and valid until that call returns (`'a`).
    pub unsafe fn input<'a>(
        &self,
        ctx: *mut OrtKernelContext,
        index: usize,
        t: ElementType,
    ) -> Result<(Vec<i64>, InputData<'a>), String> {
        let mut value: *const OrtValue = std::ptr::null();
        // SAFETY: `ctx` is valid (the caller's promise).
        self.check(unsafe { (self.0.KernelContext_GetInput)(ctx, index, &mut value) })?;
        if value.is_null() {
            return Err(format!("input {index} missing"));
        }
        // SAFETY: `value` is the host's tensor, alive for the compute call.
        unsafe { self.tensor(value, index, t) }
    }

    /// The inputs of the node `info` describes that are constant initializers (the weights),
    /// read once when its kernel is created: onnxruntime keeps them, unchanged, as long as
    /// the kernel lives, and reading each again every call (five C API calls an input) was
    /// most of the time a decode step spent between onnxruntime and the kernels. `None`
    /// for an input computed at run time (or an initializer a caller may override).
    ///
    /// # Safety
    /// `info` is the host's kernel info of the kernel being created; the elements are
    /// borrowed from the session and must not be used after the kernel is destroyed.
    pub unsafe fn constants<Op: NeedleOp>(
        &self,
        info: *const OrtKernelInfo,
    ) -> Result<Constants, String> {
        let mut count = 0;
        // SAFETY: `info` is valid (the caller's promise).
        self.check(unsafe { (self.0.KernelInfo_GetInputCount)(info, &mut count) })?;
        let types = kernel_ops::input_types::<Op>(count)?;
        let mut constants = Vec::with_capacity(count);
        for (index, t) in types.into_iter().enumerate() {
            let (mut is_constant, mut value) = (0, std::ptr::null());
            // SAFETY: as above; `value` is the session's initializer where `is_constant`.
            let status = unsafe {
                (self.0.KernelInfoGetConstantInput_tensor)(
                    info,
                    index,
                    &mut is_constant,
                    &mut value,
                )
            };
            self.check(status)?;
            constants.push(match is_constant != 0 && !value.is_null() {
                // SAFETY: the initializer lives as long as the kernel (the caller's promise
                // covers the borrow).
                true => Some(unsafe { self.tensor(value, index, t) }?),
                false => None,
            });
        }
        Ok(Constants(constants))
    }

    /// Tensor `value` (input `index`): its shape, and its elements as `t`.
    ///
    /// # Safety
    /// `value` is a live tensor of the host, unchanged while its elements are borrowed (`'a`).
    unsafe fn tensor<'a>(
        &self,
        value: *const OrtValue,
        index: usize,
        t: ElementType,
    ) -> Result<(Vec<i64>, InputData<'a>), String> {
        // SAFETY: `value` is live (the caller's promise).
        let (host_type, shape, len) = unsafe { self.type_and_shape(value)? };
        if host_type != ort_type(t) {
            return Err(format!("input {index} is {host_type:?}, not {t:?}"));
        }
        let mut data: *mut c_void = std::ptr::null_mut();
        // SAFETY: GetTensorMutableData only reads the pointer out of the (const) value; the
        // elements are never written through it.
        self.check(unsafe { (self.0.GetTensorMutableData)(value.cast_mut(), &mut data) })?;
        // SAFETY: the host's CPU tensor holds `len` elements of type `t` at `data`, aligned
        // for it, unchanged while borrowed (the caller's promise).
        let data = unsafe {
            match t {
                ElementType::Float32 => InputData::Float32(elements(data.cast(), len)),
                ElementType::Uint8 => InputData::Uint8(elements(data.cast(), len)),
                ElementType::Float16 => InputData::Float16(elements(data.cast(), len)),
                ElementType::Int64 => InputData::Int64(elements(data.cast(), len)),
            }
        };
        Ok((shape, data))
    }

    /// How many inputs the node of `ctx` has.
    ///
    /// # Safety
    /// `ctx` is the host's context of the running compute call.
    pub unsafe fn input_count(&self, ctx: *mut OrtKernelContext) -> Result<usize, String> {
        let mut count = 0;
        // SAFETY: `ctx` is valid (the caller's promise).
        self.check(unsafe { (self.0.KernelContext_GetInputCount)(ctx, &mut count) })?;
        Ok(count)
    }

    /// How many outputs the node of `ctx` has.
    ///
    /// # Safety
    /// `ctx` is the host's context of the running compute call.
    pub unsafe fn output_count(&self, ctx: *mut OrtKernelContext) -> Result<usize, String> {
        let mut count = 0;
        // SAFETY: `ctx` is valid (the caller's promise).
        self.check(unsafe { (self.0.KernelContext_GetOutputCount)(ctx, &mut count) })?;
        Ok(count)
    }

    /// Output `index` of `ctx`, allocated by the host as float32 `shape`.
    ///
    /// # Safety
    /// `ctx` is the host's context of the running compute call; the elements are borrowed
    /// from it and valid until that call returns (`'a`), and nothing else writes them.
    pub unsafe fn output<'a>(
        &self,
        ctx: *mut OrtKernelContext,
        index: usize,
        shape: &[i64],
    ) -> Result<&'a mut [f32], String> {
        let len = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| format!("output shape {shape:?} is not a size"))?;
        let mut value: *mut OrtValue = std::ptr::null_mut();
        // SAFETY: `ctx` is valid (the caller's promise); `shape` holds `shape.len()` dims.
        let status = unsafe {
            (self.0.KernelContext_GetOutput)(ctx, index, shape.as_ptr(), shape.len(), &mut value)
        };
        self.check(status)?;
        let mut data: *mut c_void = std::ptr::null_mut();
        // SAFETY: `value` is the output tensor the host just allocated.
        self.check(unsafe { (self.0.GetTensorMutableData)(value, &mut data) })?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: the host allocated `len` float32 elements at `data` for this output, which
        // only this kernel writes during the call.
        Ok(unsafe { std::slice::from_raw_parts_mut(data.cast(), len) })
    }

    /// The element type, shape and element count of tensor `value`.
    ///
    /// # Safety
    /// `value` is a live tensor of the host.
    unsafe fn type_and_shape(
        &self,
        value: *const OrtValue,
    ) -> Result<(OrtType, Vec<i64>, usize), String> {
        let mut info = std::ptr::null_mut();
        // SAFETY: `value` is live (the caller's promise); `info` is released below.
        self.check(unsafe { (self.0.GetTensorTypeAndShape)(value, &mut info) })?;
        let read = || -> Result<(OrtType, Vec<i64>, usize), String> {
            let mut t = OrtType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            let (mut rank, mut len) = (0, 0);
            // SAFETY: `info` is the live type-and-shape of `value`; `shape` has room for
            // the `rank` dims GetDimensions writes.
            unsafe {
                self.check((self.0.GetTensorElementType)(info, &mut t))?;
                self.check((self.0.GetDimensionsCount)(info, &mut rank))?;
                let mut shape = vec![0; rank];
                self.check((self.0.GetDimensions)(info, shape.as_mut_ptr(), rank))?;
                self.check((self.0.GetTensorShapeElementCount)(info, &mut len))?;
                Ok((t, shape, len))
            }
        };
        let result = read();
        // SAFETY: `info` came from GetTensorTypeAndShape and is released once.
        unsafe { (self.0.ReleaseTensorTypeAndShapeInfo)(info) };
        result
    }
}

/// One compute call of `op`: its inputs read from `ctx`, its outputs allocated by the host
/// as `op` shapes them, and the op run on the session's threads. The library's kernels
/// and `needle-run`'s in-process ones (through the `ort` crate's API table) both compute
/// so: `ort`'s own tensor views built each input's full type description, a quarter of
/// the time a decode step spent outside the kernels.
///
/// # Safety
/// `ctx` is the host's context of the running compute call, whose tensors outlive it.
pub unsafe fn run<Op: NeedleOp>(
    api: Api,
    op: &Op,
    constants: &Constants,
    ctx: *mut OrtKernelContext,
) -> Result<(), String> {
    // SAFETY (each call below): `ctx` is the running call's context (the caller's promise).
    let count = unsafe { api.input_count(ctx) }.map_err(op_error::<Op>)?;
    let types = kernel_ops::input_types::<Op>(count)?;
    // Only the inputs computed at run time are read; the weights were, once.
    let read = types
        .into_iter()
        .enumerate()
        .map(|(i, t)| match constants.get(i) {
            Some(_) => Ok(None),
            None => unsafe { api.input(ctx, i, t) }.map(Some),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(op_error::<Op>)?;
    let mut inputs: Vec<Input> = read
        .iter()
        .enumerate()
        .map(|(i, read)| {
            let (shape, data) = read
                .as_ref()
                .or(constants.get(i))
                .expect("read or constant");
            Input { shape, data: *data }
        })
        .collect();
    let mut shapes = op.output_shapes(&inputs)?;
    shapes.truncate(unsafe { api.output_count(ctx) }.map_err(op_error::<Op>)?);
    let mut outputs = shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| unsafe { api.output(ctx, i, shape) })
        .collect::<Result<Vec<_>, _>>()
        .map_err(op_error::<Op>)?;
    // A cache bound as both past and present: the op reads it from the output alone.
    kernel_ops::unalias::<Op>(&mut inputs, &outputs);
    let threads = SessionThreads { api, ctx };
    Ok(kernel_ops::compute(
        op,
        &inputs,
        &shapes,
        &mut outputs,
        &threads,
    )?)
}

/// A kernel's constant inputs ([`Api::constants`]): input `i`'s shape and elements, or
/// `None` where it is read at each call.
pub struct Constants(Vec<Option<(Vec<i64>, InputData<'static>)>>);

impl Constants {
    /// Input `i`'s shape and elements, where it is constant.
    fn get(&self, i: usize) -> Option<&(Vec<i64>, InputData<'static>)> {
        self.0.get(i).and_then(Option::as_ref)
    }
}

/// `len` elements at `data` (none: an empty slice, whatever the pointer).
///
/// # Safety
/// For `len > 0`, `data` points at `len` initialized, aligned `T` that stay unchanged for `'a`.
unsafe fn elements<'a, T>(data: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(data, len) }
    }
}

/// The C API's element type of `t`.
pub fn ort_type(t: ElementType) -> OrtType {
    match t {
        ElementType::Float32 => OrtType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        ElementType::Uint8 => OrtType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
        ElementType::Float16 => OrtType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
        ElementType::Int64 => OrtType::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
    }
}

/// A panic's message, where it has one.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Row blocks on the session's intra-op thread pool (`KernelContext_ParallelFor`).
struct SessionThreads {
    api: Api,
    ctx: *mut OrtKernelContext,
}

/// One parallel-for: the blocks' function and the first panic of any block, which is
/// raised again on the calling thread once every block has run.
struct Blocks<'f> {
    f: &'f (dyn Fn(usize) + Sync),
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Runs one block for the host's thread pool, a panic kept for the caller rather than
/// unwinding into onnxruntime.
unsafe extern "C" fn run_block(blocks: *mut c_void, block: usize) {
    // SAFETY: `blocks` is the `Blocks` that `for_each` passed, alive until ParallelFor
    // returns, which is after every block has run.
    let blocks = unsafe { &*blocks.cast::<Blocks>() };
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (blocks.f)(block))) {
        let mut first = blocks.panic.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(panic);
    }
}

impl RowSplit for SessionThreads {
    fn for_each(&self, count: usize, f: &(dyn Fn(usize) + Sync)) {
        let blocks = Blocks {
            f,
            panic: Mutex::new(None),
        };
        // SAFETY: `ctx` is the running compute call's context; `blocks` outlives the call,
        // which returns only when every block has run; `f` is Sync, so blocks may run on
        // any thread at once.
        let status = unsafe {
            (self.api.raw().KernelContext_ParallelFor)(
                self.ctx,
                run_block,
                count,
                0,
                (&blocks as *const Blocks).cast_mut().cast(),
            )
        };
        // A failed parallel-for (no pool) runs the blocks here instead.
        if self.api.check(status).is_err() {
            (0..count).for_each(f);
        }
        if let Some(panic) = blocks.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            std::panic::resume_unwind(panic);
        }
    }
}
