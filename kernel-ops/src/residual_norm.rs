//! `needle.ResidualNorm` (`kernels/src/residual_norm.rs` states it): inputs `x` and `h`
//! float32 `[…, d]`, the norm's `gain` `[d]` and `scale` `[1]`; output float32 shaped like
//! `x`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::residual_norm::residual_norm;

pub struct ResidualNorm;

/// `x`'s shape; `x`, `h` and `gain`; the scale.
type Operands<'a> = (&'a [i64], [&'a [f32]; 3], f32);

impl ResidualNorm {
    /// `x`'s shape, `x`, `h`, `gain` and the scale, checked against each other.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let (h_shape, h) = Input::get::<Self, f32>(inputs, 1)?;
        let (_, gain) = Input::get::<Self, f32>(inputs, 2)?;
        let (_, scale) = Input::get::<Self, f32>(inputs, 3)?;
        let fits = h_shape == x_shape
            && x_shape
                .last()
                .is_some_and(|&d| d > 0 && d as usize == gain.len());
        match (fits, scale) {
            (true, &[scale]) => Ok((x_shape, [x, h, gain], scale)),
            _ => Err(op_error::<Self>(format!(
                "x {x_shape:?}, h {h_shape:?}, a gain of {} and {} scales are not [.., d], [.., d], d and 1",
                gain.len(),
                scale.len()
            ))),
        }
    }
}

impl NeedleOp for ResidualNorm {
    const NAME: &'static str = needle_ops::RESIDUAL_NORM;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 4];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(ResidualNorm)
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
        let (_, [x, h, gain], scale) = Self::operands(inputs)?;
        residual_norm(x, h, gain, scale, outputs[0], split);
        Ok(())
    }
}
