//! `needle.CqMatMul` (`kernels/src/cq_matmul/mod.rs` states its contract): inputs `X`
//! float32 `[…, cols]`, `codes` uint8 `[rows, row bytes]`, `norms` float16
//! `[rows, groups]`, `codebook` float32 `[2^bits]`; attributes `cols`, `group`, `bits`;
//! output float32 `[…, rows]`.

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::{cq_matmul, CqMatrix, Isa};

pub struct CqMatMul {
    cols: usize,
    group: usize,
    bits: usize,
    isa: Isa,
}

impl CqMatMul {
    /// The CQ matrix of `inputs` and the activations `X` with their shape, checked against
    /// each other and the attributes.
    fn operands<'a>(
        &self,
        inputs: &[Input<'a>],
    ) -> Result<(CqMatrix<'a>, &'a [i64], &'a [f32]), OpError> {
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let (codes_shape, codes) = Input::get::<Self, u8>(inputs, 1)?;
        let (_, norms) = Input::get::<Self, u16>(inputs, 2)?;
        let (_, codebook) = Input::get::<Self, f32>(inputs, 3)?;
        let rows = codes_shape.first().copied().unwrap_or(0) as usize;
        let w = CqMatrix::new(
            rows, self.cols, self.group, self.bits, codes, norms, codebook,
        )
        .map_err(op_error::<Self>)?;
        if x_shape.last().copied() != Some(self.cols as i64) {
            return Err(op_error::<Self>(format!(
                "X is {x_shape:?}, its last axis must be cols = {}",
                self.cols
            )));
        }
        Ok((w, x_shape, x))
    }
}

impl NeedleOp for CqMatMul {
    const NAME: &'static str = needle_ops::CQ_MATMUL;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32,
        ElementType::Uint8,
        ElementType::Float16,
        ElementType::Float32,
    ];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(CqMatMul {
            cols: size_attribute::<Self>(attribute, "cols")?,
            group: size_attribute::<Self>(attribute, "group")?,
            bits: size_attribute::<Self>(attribute, "bits")?,
            isa: Isa::best(),
        })
    }

    fn output_shape(&self, inputs: &[Input]) -> Result<Vec<i64>, OpError> {
        let (w, x_shape, _) = self.operands(inputs)?;
        let mut y_shape = x_shape.to_vec();
        *y_shape.last_mut().expect("operands checked the last axis") = w.rows() as i64;
        Ok(y_shape)
    }

    fn compute(
        &self,
        inputs: &[Input],
        output: &mut [f32],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (w, _, x) = self.operands(inputs)?;
        let tokens = x.len() / self.cols;
        if output.len() != tokens * w.rows() {
            return Err(op_error::<Self>(format!(
                "Y holds {} values, {tokens} tokens × {} rows need {}",
                output.len(),
                w.rows(),
                tokens * w.rows()
            )));
        }
        cq_matmul(&w, x, tokens, output, self.isa, split);
        Ok(())
    }
}
