//! The Needle op domain in this process: the ops `kernel-ops` defines, registered through
//! onnxruntime's custom-operator API as the `ort` crate offers it. Every session gets it,
//! so a packed graph loads wherever `needle-run` loads graphs; stock graphs never name its
//! ops.
//!
//! A kernel reads its weights from the graph's initializers on every call: onnxruntime
//! keeps them for the session, so nothing is copied or repacked.

use graphs::contract::needle_ops;
use kernel_ops::{ElementType, NeedleOp, Presence, Registry, DOMAIN, OUTPUT_TYPE};
use needle_kernels::{Api, Constants};
use ort::operator::{
    ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::value::TensorElementType;
use ort::AsPointer;
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
        // Sound: `info` describes the kernel being created; the constants it holds are
        // used only by this kernel, which onnxruntime destroys before the initializers.
        let constants =
            unsafe { Api::new(ort::api()).constants::<Op>(info.ptr()) }.map_err(ort::Error::new)?;
        Ok(OrtKernel { op, constants })
    }
}

/// A Needle op and its weights, read once ([`Api::constants`]).
struct OrtKernel<Op> {
    op: Op,
    constants: Constants,
}

impl<Op: NeedleOp> Kernel for OrtKernel<Op> {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        // The C API's tensors and thread pool, as libneedle_kernels uses them in any host:
        // `ort::api()` is this process's onnxruntime, whose API table lives while it is
        // loaded. Sound: `ctx` is the context of this compute call.
        let api = Api::new(ort::api());
        unsafe { needle_kernels::run(api, &self.op, &self.constants, ctx.ptr().cast_mut()) }
            .map_err(ort::Error::new)
    }
}
