//! `needle.EngramGate` (`kernels/src/engram_gate.rs` states it): inputs `x`, `key_unit` and
//! `value`, float32 `[…, d]` each; output float32 shaped like `x`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::engram_gate::engram_gate;

pub struct EngramGate;

impl EngramGate {
    /// `x`'s shape and the three tensors, checked to be shaped alike.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<(&'a [i64], [&'a [f32]; 3]), OpError> {
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let (key_shape, key) = Input::get::<Self, f32>(inputs, 1)?;
        let (value_shape, value) = Input::get::<Self, f32>(inputs, 2)?;
        if key_shape != x_shape || value_shape != x_shape || x_shape.last().is_none_or(|&d| d <= 0)
        {
            return Err(op_error::<Self>(format!(
                "x {x_shape:?}, key_unit {key_shape:?} and value {value_shape:?} are not one shape [.., d]"
            )));
        }
        Ok((x_shape, [x, key, value]))
    }
}

impl NeedleOp for EngramGate {
    const NAME: &'static str = needle_ops::ENGRAM_GATE;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 3];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(EngramGate)
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        Self::operands(inputs).map(|(shape, _)| vec![shape.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (shape, [x, key, value]) = Self::operands(inputs)?;
        let d = *shape.last().expect("operands checked [.., d]") as usize;
        engram_gate(x, key, value, d, outputs[0], split);
        Ok(())
    }
}
