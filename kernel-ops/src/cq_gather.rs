//! `needle.CqGather`: rows of a CQ matrix decoded as they are gathered
//! (`kernels/src/cq_matmul/rows.rs`). Inputs `indices` int64 (any shape), `codes` uint8
//! `[rows, row bytes]`, `norms` float16 `[rows, groups]`, `codebook` float32 `[2^bits]`;
//! attributes `cols`, `group`, `bits`; output float32 `[indices.., cols]`.

use crate::cq_matmul::CqLayout;
use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::isa::Isa;
use kernels::CqMatrix;

pub struct CqGather {
    layout: CqLayout,
    isa: Isa,
}

impl CqGather {
    /// The matrix and the indices with their shape, checked against the attributes.
    fn operands<'a>(
        &self,
        inputs: &[Input<'a>],
    ) -> Result<(CqMatrix<'a>, &'a [i64], &'a [i64]), OpError> {
        let (indices_shape, indices) = Input::get::<Self, i64>(inputs, 0)?;
        Ok((
            self.layout.matrix::<Self>(inputs, 1)?,
            indices_shape,
            indices,
        ))
    }
}

impl NeedleOp for CqGather {
    const NAME: &'static str = needle_ops::CQ_GATHER;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Int64,
        ElementType::Uint8,
        ElementType::Float16,
        ElementType::Float32,
    ];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(CqGather {
            layout: CqLayout::of::<Self>(attribute)?,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (w, indices_shape, _) = self.operands(inputs)?;
        let mut shape = indices_shape.to_vec();
        shape.push(w.cols() as i64);
        Ok(vec![shape])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (w, _, indices) = self.operands(inputs)?;
        w.gather_rows(self.isa, indices, outputs[0], split)
            .map_err(op_error::<Self>)
    }
}
