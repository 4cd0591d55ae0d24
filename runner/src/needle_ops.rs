//! The Needle op domain in this process: the ops `kernel-ops` defines, registered through
//! onnxruntime's custom-operator API as the `ort` crate offers it. Every session gets it,
//! so a packed graph loads wherever `needle-run` loads graphs; stock graphs never name its
//! ops.
//!
//! A kernel reads its weights from the graph's initializers on every call: onnxruntime
//! keeps them for the session, so nothing is copied or repacked.

use graphs::contract::needle_ops;
use kernel_ops::{
    op_error, ElementType, Input, InputData, NeedleOp, Presence, Registry, RowSplit, DOMAIN,
    OUTPUT_TYPE,
};
use ort::operator::{
    ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::value::{DynTensorValueType, TensorElementType, ValueRef, ValueType};
use std::marker::PhantomData;

/// The domain with every Needle op.
pub fn domain() -> ort::Result<OperatorDomain> {
    let mut builder = DomainBuilder(Some(OperatorDomain::new(DOMAIN)?));
    kernel_ops::register_all(&mut builder)?;
    Ok(builder.0.expect("every add succeeded"))
}

/// The smallest graph that uses the domain: one `needle.Sinkhorn` of a 2 × 2 matrix.
pub(crate) fn sinkhorn_model() -> Vec<u8> {
    use graphs::builder::{Attr, Dim, GraphBuilder, Opset};
    use graphs::contract::Precision;
    use graphs::onnx::data_type::FLOAT;
    use prost::Message;
    let mut b = GraphBuilder::new(Opset::V21, Precision::Fp32);
    let dims = [Dim::Fixed(2), Dim::Fixed(2)];
    let x = b.input("x", FLOAT, &dims);
    let attrs = vec![("iterations", Attr::Int(1))];
    let y = b.op_in(needle_ops::DOMAIN, needle_ops::SINKHORN, &[&x], attrs, 1);
    b.output(&y[0], "y", FLOAT, &dims);
    b.finish("register_needle_domain", String::new(), Vec::new())
        .encode_to_vec()
}

/// Builds the `ort` domain from the ops `kernel_ops::register_all` hands over.
struct DomainBuilder(Option<OperatorDomain>);

impl Registry for DomainBuilder {
    type Error = ort::Error;

    fn add<Op: NeedleOp>(&mut self) -> ort::Result<()> {
        let domain = self.0.take().expect("a failed add ends the registration");
        self.0 = Some(domain.add(OrtOperator::<Op>(PhantomData))?);
        Ok(())
    }
}

/// A Needle op as an `ort` operator.
struct OrtOperator<Op>(PhantomData<Op>);

/// The `ort` type of each element type.
fn ort_type(t: ElementType) -> TensorElementType {
    match t {
        ElementType::Float32 => TensorElementType::Float32,
        ElementType::Uint8 => TensorElementType::Uint8,
        ElementType::Float16 => TensorElementType::Float16,
        ElementType::Int64 => TensorElementType::Int64,
    }
}

impl<Op: NeedleOp> Operator for OrtOperator<Op> {
    type Kernel<'attr> = OrtKernel<Op>;

    fn name(&self) -> &str {
        Op::NAME
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        kernel_ops::declared_inputs::<Op>()
            .enumerate()
            .map(|(i, t)| match Presence::of_input::<Op>(i) {
                Presence::Required => OperatorInput::required(ort_type(t)),
                Presence::Optional => OperatorInput::optional(ort_type(t)),
                Presence::Variadic => OperatorInput::variadic(1).homogenous(ort_type(t)),
            })
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        let t = ort_type(OUTPUT_TYPE);
        (0..Op::OUTPUTS + Op::OPTIONAL_OUTPUTS).map(move |i| match Presence::of_output::<Op>(i) {
            Presence::Required => OperatorOutput::required(t),
            _ => OperatorOutput::optional(t),
        })
    }

    fn create_kernel<'attr>(&self, info: &KernelContext<'attr>) -> ort::Result<OrtKernel<Op>> {
        let op = Op::new(&|name| info.get::<i64>(name)).map_err(ort::Error::new)?;
        Ok(OrtKernel(op))
    }
}

struct OrtKernel<Op>(Op);

impl<Op: NeedleOp> Kernel for OrtKernel<Op> {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let count = ctx.num_inputs()?;
        let types = kernel_ops::input_types::<Op>(count).map_err(ort::Error::new)?;
        let values = (0..count)
            .map(|i| {
                ctx.input(i)?
                    .ok_or_else(|| ort::Error::new(op_error::<Op>(format!("input {i} missing"))))
            })
            .collect::<ort::Result<Vec<_>>>()?;
        let mut inputs = values
            .iter()
            .zip(types)
            .map(|(value, t)| input(value, t))
            .collect::<ort::Result<Vec<_>>>()?;
        let mut shapes = self.0.output_shapes(&inputs).map_err(ort::Error::new)?;
        shapes.truncate(ctx.num_outputs()?);
        let mut values = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                ctx.output(i, shape.clone())?
                    .ok_or_else(|| ort::Error::new(op_error::<Op>(format!("no output {i}"))))
            })
            .collect::<ort::Result<Vec<_>>>()?;
        let mut outputs = values
            .iter_mut()
            .map(|y| y.try_extract_tensor_mut::<f32>().map(|(_, y)| y))
            .collect::<ort::Result<Vec<_>>>()?;
        // A cache bound as both past and present: the op reads it from the output alone.
        kernel_ops::unalias::<Op>(&mut inputs, &outputs);
        kernel_ops::compute(
            &self.0,
            &inputs,
            &shapes,
            &mut outputs,
            &SessionThreads(ctx),
        )
        .map_err(ort::Error::new)
    }
}

/// `value`'s shape and elements as element type `t`.
fn input<'a>(value: &'a ValueRef<'_>, t: ElementType) -> ort::Result<Input<'a>> {
    Ok(match t {
        ElementType::Float32 => {
            let (shape, data) = value.try_extract_tensor::<f32>()?;
            Input {
                shape,
                data: InputData::Float32(data),
            }
        }
        ElementType::Uint8 => {
            let (shape, data) = value.try_extract_tensor::<u8>()?;
            Input {
                shape,
                data: InputData::Uint8(data),
            }
        }
        ElementType::Int64 => {
            let (shape, data) = value.try_extract_tensor::<i64>()?;
            Input {
                shape,
                data: InputData::Int64(data),
            }
        }
        ElementType::Float16 => {
            let ValueType::Tensor {
                ty: TensorElementType::Float16,
                shape,
                ..
            } = value.dtype()
            else {
                return Err(ort::Error::new(format!(
                    "expected a float16 tensor, got {}",
                    value.dtype()
                )));
            };
            let len = shape.num_elements();
            let data = if len == 0 {
                &[][..]
            } else {
                // The kernels take halves as their bits (kernels::f16 converts them), so the
                // `half` crate, and the zerocopy it brings into needle-run's build, are not
                // needed for this one read. Sound: the tensor is a float16 tensor (checked
                // above) of `len` 2-byte elements in the host memory of a CPU kernel's input,
                // which onnxruntime keeps alive and unchanged for the borrow of `value`.
                let tensor = value.view().downcast::<DynTensorValueType>()?;
                unsafe { std::slice::from_raw_parts(tensor.data_ptr().cast::<u16>(), len) }
            };
            Input {
                shape,
                data: InputData::Float16(data),
            }
        }
    })
}

/// Row blocks on the session's intra-op thread pool.
struct SessionThreads<'a>(&'a ComputeContext);

impl RowSplit for SessionThreads<'_> {
    fn for_each(&self, blocks: usize, f: &(dyn Fn(usize) + Sync)) {
        // A failed parallel-for (no pool) runs the blocks here instead.
        if self.0.par_for(blocks, 0, f).is_err() {
            (0..blocks).for_each(f);
        }
    }
}
