//! `needle.HadamardMlp` (`kernels/src/hadamard_mlp.rs` states it): inputs `x` float32
//! `[…, d_model]` and the diagonals `d1`, `d2`, `d3` `[n]`; output float32 shaped like `x`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::hadamard_mlp::HadamardMlp as Mlp;

pub struct HadamardMlp;

/// `x`'s shape, its elements, its width and the layer's MLP.
type Operands<'a> = (&'a [i64], &'a [f32], usize, Mlp<'a>);

impl HadamardMlp {
    /// `x` with its shape and width, and the layer's MLP, checked against each other.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let diagonal = |i| Input::get::<Self, f32>(inputs, i).map(|(_, d)| d);
        let mlp = Mlp {
            diagonals: [diagonal(1)?, diagonal(2)?, diagonal(3)?],
        };
        let d_model = x_shape.last().copied().unwrap_or(0) as usize;
        if mlp.width(d_model).is_none() {
            return Err(op_error::<Self>(format!(
                "x is {x_shape:?}; the diagonals ({}, {}, {}) are not one power of two ≥ its last axis",
                mlp.diagonals[0].len(),
                mlp.diagonals[1].len(),
                mlp.diagonals[2].len()
            )));
        }
        Ok((x_shape, x, d_model, mlp))
    }
}

impl NeedleOp for HadamardMlp {
    const NAME: &'static str = needle_ops::HADAMARD_MLP;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 4];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(HadamardMlp)
    }

    fn output_shape(&self, inputs: &[Input]) -> Result<Vec<i64>, OpError> {
        Self::operands(inputs).map(|(shape, ..)| shape.to_vec())
    }

    fn compute(
        &self,
        inputs: &[Input],
        output: &mut [f32],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (_, x, d_model, mlp) = Self::operands(inputs)?;
        if output.len() != x.len() {
            return Err(op_error::<Self>("the output is not shaped like x"));
        }
        mlp.apply(x, d_model, output, split);
        Ok(())
    }
}
