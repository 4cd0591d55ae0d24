//! A host tensor's elements as bytes, which the cache's rows are copied through.

use anyhow::{bail, Result};
use ort::memory::AllocationDevice;
use ort::value::{DynTensorValueType, DynValue, TensorElementType};

/// Sets every element of a host tensor to zero.
pub(super) fn zero(value: &mut DynValue) -> Result<()> {
    host_bytes_mut(value)?.bytes.fill(0);
    Ok(())
}

/// A tensor's elements as bytes, its shape and element size.
pub(super) struct HostBytes<B> {
    pub bytes: B,
    pub shape: Vec<usize>,
    pub element: usize,
}

fn element_size(ty: TensorElementType) -> Result<usize> {
    Ok(match ty {
        TensorElementType::Float32 => 4,
        TensorElementType::Float16 => 2,
        TensorElementType::Int32 => 4,
        TensorElementType::Int64 => 8,
        other => bail!("a cache tensor of {other:?}"),
    })
}

pub(super) fn host_bytes(value: &DynValue) -> Result<HostBytes<&[u8]>> {
    let tensor = value.view().downcast::<DynTensorValueType>()?;
    if tensor.memory_info().allocation_device() != AllocationDevice::CPU {
        bail!("the cache is not in host memory, so rows cannot join or leave the batch");
    }
    let shape: Vec<usize> = tensor.shape().iter().map(|&d| d as usize).collect();
    let element = element_size(*tensor.data_type())?;
    let len = shape.iter().product::<usize>() * element;
    let data = tensor.data_ptr().cast::<u8>();
    // SAFETY: a host tensor of `len` bytes, which `value` owns and keeps alive for as long
    // as the borrow this returns.
    let bytes = match len {
        0 => &[][..],
        _ => unsafe { std::slice::from_raw_parts(data, len) },
    };
    Ok(HostBytes {
        bytes,
        shape,
        element,
    })
}

pub(super) fn host_bytes_mut(value: &mut DynValue) -> Result<HostBytes<&mut [u8]>> {
    let HostBytes {
        bytes,
        shape,
        element,
    } = host_bytes(value)?;
    let (data, len) = (bytes.as_ptr().cast_mut(), bytes.len());
    // SAFETY: as in `host_bytes` (onnxruntime hands out the tensor's data as mutable),
    // borrowed mutably from `value`.
    let bytes = match len {
        0 => &mut [][..],
        _ => unsafe { std::slice::from_raw_parts_mut(data, len) },
    };
    Ok(HostBytes {
        bytes,
        shape,
        element,
    })
}
