//! `needle.HadamardMlp` (`kernels/src/hadamard_mlp.rs` states it): inputs `x` float32
//! `[…, d_model]`, the diagonals `d1`, `d2`, `d3` `[n]` and the pre-MLP norm's `gain`
//! `[d_model]`; output float32 shaped like `x`: the layer's MLP half, `x + mlp(norm(x))`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::hadamard_mlp::HadamardMlp as Mlp;
use kernels::isa::Isa;

pub struct HadamardMlp;

/// `x`'s shape and elements, the norm's gain and the layer's MLP.
type Operands<'a> = (&'a [i64], &'a [f32], &'a [f32], Mlp<'a>);

impl HadamardMlp {
    /// `x` with its shape, the gain and the layer's MLP, checked against each other.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let diagonal = |i| Input::get::<Self, f32>(inputs, i).map(|(_, d)| d);
        let mlp = Mlp {
            diagonals: [diagonal(1)?, diagonal(2)?, diagonal(3)?],
            isa: Isa::best(),
        };
        let d_model = x_shape.last().copied().unwrap_or(0) as usize;
        let gain = diagonal(4)?;
        if gain.len() != d_model {
            return Err(op_error::<Self>(format!(
                "x is {x_shape:?}, the gain holds {}: not one width",
                gain.len()
            )));
        }
        if mlp.width(d_model).is_none() {
            return Err(op_error::<Self>(format!(
                "x is {x_shape:?}; the diagonals ({}, {}, {}) are not one power of two ≥ its last axis",
                mlp.diagonals[0].len(),
                mlp.diagonals[1].len(),
                mlp.diagonals[2].len()
            )));
        }
        Ok((x_shape, x, gain, mlp))
    }
}

impl NeedleOp for HadamardMlp {
    const NAME: &'static str = needle_ops::HADAMARD_MLP;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 5];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(HadamardMlp)
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        Self::operands(inputs).map(|(shape, ..)| vec![shape.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (_, x, gain, mlp) = Self::operands(inputs)?;
        mlp.apply(x, gain, outputs[0], split);
        Ok(())
    }
}
