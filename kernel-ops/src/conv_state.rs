//! `needle.ConvState` (`kernels/src/conv_state.rs` states it): inputs the layer's
//! `projections` float32 `[batch, sequence, width]`, the conv `state` `[batch, taps − 1,
//! conv width]` and `real_new` int64 (each row's count of real new tokens, `batch` values);
//! output float32 shaped like `state`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::conv_state::{conv_state, ConvWindow};

pub struct ConvState;

/// The window, the counts of new tokens and the state's shape.
type Operands<'a> = (ConvWindow<'a>, &'a [i64], &'a [i64]);

impl ConvState {
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let (p_shape, projections) = Input::get::<Self, f32>(inputs, 0)?;
        let (state_shape, state) = Input::get::<Self, f32>(inputs, 1)?;
        let (_, real_new) = Input::get::<Self, i64>(inputs, 2)?;
        let (&[batch, sequence, projections_width], &[_, _, width]) = (p_shape, state_shape) else {
            return Err(op_error::<Self>(format!(
                "projections {p_shape:?} and state {state_shape:?} are not [batch, ·, width]"
            )));
        };
        same_batch::<Self>(p_shape, state_shape)?;
        let window = ConvWindow {
            state,
            projections,
            projections_width: projections_width as usize,
            batch: batch as usize,
            sequence: sequence as usize,
            width: width as usize,
        };
        window.state_rows().map_err(op_error::<Self>)?;
        Ok((window, real_new, state_shape))
    }
}

/// The error of a conv `state` whose batch is not the `projections`' (`[batch, ..]` each):
/// the next state has one per batch row.
pub(crate) fn same_batch<Op: NeedleOp>(
    p_shape: &[i64],
    state_shape: &[i64],
) -> Result<(), OpError> {
    match p_shape.first() == state_shape.first() {
        true => Ok(()),
        false => Err(op_error::<Op>(format!(
            "projections {p_shape:?} and state {state_shape:?} are not one batch"
        ))),
    }
}

impl NeedleOp for ConvState {
    const NAME: &'static str = needle_ops::CONV_STATE;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // projections
        ElementType::Float32, // state
        ElementType::Int64,   // real_new
    ];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(ConvState)
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        Self::operands(inputs).map(|(.., shape)| vec![shape.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        _split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (window, real_new, _) = Self::operands(inputs)?;
        conv_state(&window, real_new, outputs[0]).map_err(op_error::<Self>)
    }
}
