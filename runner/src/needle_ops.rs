//! The Needle op domain in this process: onnxruntime's custom-operator API (through
//! `ort`) over the `kernels` crate. Every session gets it, so a packed graph loads
//! wherever `needle-run` loads graphs; stock graphs never name its ops.
//!
//! A kernel reads its weights from the graph's initializers on every call: onnxruntime
//! keeps them for the session, so nothing is copied or repacked.

use graphs::contract::needle_ops;
use half::slice::HalfFloatSliceExt;
use kernels::{cq_matmul, sinkhorn, CqMatrix, Isa, RowSplit};
use ort::operator::{
    ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::value::TensorElementType;

/// The domain with every Needle op.
pub fn domain() -> ort::Result<OperatorDomain> {
    OperatorDomain::new(needle_ops::DOMAIN)?
        .add(CqMatMulOp)?
        .add(SinkhornOp)
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

/// `needle.CqMatMul` (`kernels/src/cq_matmul/mod.rs` states its contract).
struct CqMatMulOp;

impl Operator for CqMatMulOp {
    type Kernel<'attr> = CqMatMulKernel;

    fn name(&self) -> &str {
        needle_ops::CQ_MATMUL
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Uint8),
            OperatorInput::required(TensorElementType::Float16),
            OperatorInput::required(TensorElementType::Float32),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, info: &KernelContext<'attr>) -> ort::Result<CqMatMulKernel> {
        let attribute = |name: &str| {
            info.get::<i64>(name)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| ort::Error::new(format!("needle.CqMatMul: no attribute {name}")))
        };
        Ok(CqMatMulKernel {
            cols: attribute("cols")?,
            group: attribute("group")?,
            bits: attribute("bits")?,
            isa: Isa::best(),
        })
    }
}

struct CqMatMulKernel {
    cols: usize,
    group: usize,
    bits: usize,
    isa: Isa,
}

impl Kernel for CqMatMulKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let input = |i: usize| {
            ctx.input(i)?
                .ok_or_else(|| ort::Error::new(format!("needle.CqMatMul: input {i} missing")))
        };
        let (x, codes, norms, codebook) = (input(0)?, input(1)?, input(2)?, input(3)?);
        let (x_shape, x) = x.try_extract_tensor::<f32>()?;
        let (codes_shape, codes) = codes.try_extract_tensor::<u8>()?;
        let (_, norms) = norms.try_extract_tensor::<half::f16>()?;
        let (_, codebook) = codebook.try_extract_tensor::<f32>()?;
        let rows = codes_shape.first().copied().unwrap_or(0) as usize;
        let w = CqMatrix::new(
            rows,
            self.cols,
            self.group,
            self.bits,
            codes,
            norms.reinterpret_cast(),
            codebook,
        )
        .map_err(|e| ort::Error::new(format!("needle.CqMatMul: {e}")))?;
        if x_shape.last().copied() != Some(self.cols as i64) {
            return Err(ort::Error::new(format!(
                "needle.CqMatMul: X is {x_shape:?}, its last axis must be cols = {}",
                self.cols
            )));
        }
        let mut y_shape = x_shape.to_vec();
        *y_shape.last_mut().expect("checked above") = rows as i64;
        let mut y = ctx
            .output(0, y_shape)?
            .ok_or_else(|| ort::Error::new("needle.CqMatMul: no output"))?;
        let (_, y) = y.try_extract_tensor_mut::<f32>()?;
        let tokens = x.len() / self.cols;
        cq_matmul(&w, x, tokens, y, self.isa, &SessionThreads(ctx));
        Ok(())
    }
}

/// `needle.Sinkhorn` (`kernels/src/sinkhorn.rs` states its contract).
struct SinkhornOp;

impl Operator for SinkhornOp {
    type Kernel<'attr> = SinkhornKernel;

    fn name(&self) -> &str {
        needle_ops::SINKHORN
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [OperatorInput::required(TensorElementType::Float32)]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, info: &KernelContext<'attr>) -> ort::Result<SinkhornKernel> {
        let iterations = info
            .get::<i64>("iterations")
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| ort::Error::new("needle.Sinkhorn: no attribute iterations"))?;
        Ok(SinkhornKernel { iterations })
    }
}

struct SinkhornKernel {
    iterations: usize,
}

impl Kernel for SinkhornKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let logits = ctx
            .input(0)?
            .ok_or_else(|| ort::Error::new("needle.Sinkhorn: input missing"))?;
        let (shape, logits) = logits.try_extract_tensor::<f32>()?;
        let n = match shape.as_ref() {
            [.., rows, cols] if rows == cols && *rows > 0 => *rows as usize,
            _ => {
                return Err(ort::Error::new(format!(
                    "needle.Sinkhorn: logits are {shape:?}, not [.., n, n]"
                )))
            }
        };
        let mut out = ctx
            .output(0, shape.to_vec())?
            .ok_or_else(|| ort::Error::new("needle.Sinkhorn: no output"))?;
        let (_, out) = out.try_extract_tensor_mut::<f32>()?;
        sinkhorn(logits, n, self.iterations, out);
        Ok(())
    }
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
