//! `needle.EngramValue` (`kernels/src/engram_value.rs` states it): inputs the window's
//! n-gram `rows` float32 `[batch, window, cols]`, `valid` `[batch, window]`, the conv
//! `taps` `[taps, d]`, then `value_proj` as `codes`, `norms`, `codebook` (as
//! `needle.CqMatMul` reads them); attributes `cols`, `group`, `bits` (the projection's),
//! `dilation`, `history`. Output float32 `[batch, window − history, d]`.

use crate::cq_matmul::CqLayout;
use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::engram_value::{engram_value, DilatedConv, EngramWindowRows};
use kernels::{CqMatrix, Isa};

pub struct EngramValue {
    projection: CqLayout,
    dilation: usize,
    history: usize,
    isa: Isa,
}

impl EngramValue {
    /// The window, the conv and the projection, checked against each other.
    fn operands<'a>(
        &self,
        inputs: &[Input<'a>],
    ) -> Result<(EngramWindowRows<'a>, DilatedConv<'a>, CqMatrix<'a>), OpError> {
        let (rows_shape, rows) = Input::get::<Self, f32>(inputs, 0)?;
        let (valid_shape, valid) = Input::get::<Self, f32>(inputs, 1)?;
        let (taps_shape, taps) = Input::get::<Self, f32>(inputs, 2)?;
        let w = self.projection.matrix::<Self>(inputs, 3)?;
        let &[batch, window, cols] = rows_shape else {
            return Err(op_error::<Self>(format!(
                "rows are {rows_shape:?}, not [batch, window, cols]"
            )));
        };
        if cols as usize != w.cols() || valid_shape != [batch, window] {
            return Err(op_error::<Self>(format!(
                "rows {rows_shape:?} and valid {valid_shape:?} do not fit a projection of {} columns",
                w.cols()
            )));
        }
        if taps_shape.len() != 2 || taps_shape[1] as usize != w.rows() || taps_shape[0] == 0 {
            return Err(op_error::<Self>(format!(
                "taps are {taps_shape:?}, not [taps, {}]",
                w.rows()
            )));
        }
        if (window as usize) < self.history {
            return Err(op_error::<Self>(format!(
                "a window of {window} rows holds no history of {}",
                self.history
            )));
        }
        let window_rows = EngramWindowRows {
            rows,
            valid,
            batch: batch as usize,
            window: window as usize,
        };
        let conv = DilatedConv {
            taps,
            dilation: self.dilation,
            history: self.history,
        };
        Ok((window_rows, conv, w))
    }
}

impl NeedleOp for EngramValue {
    const NAME: &'static str = needle_ops::ENGRAM_VALUE;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // rows
        ElementType::Float32, // valid
        ElementType::Float32, // taps
        ElementType::Uint8,   // codes
        ElementType::Float16, // norms
        ElementType::Float32, // codebook
    ];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(EngramValue {
            projection: CqLayout::of::<Self>(attribute)?,
            dilation: size_attribute::<Self>(attribute, "dilation")?,
            history: size_attribute::<Self>(attribute, "history")?,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (window, _, w) = self.operands(inputs)?;
        let new = window.window - self.history;
        Ok(vec![[window.batch, new, w.rows()]
            .map(|d| d as i64)
            .to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (window, conv, w) = self.operands(inputs)?;
        engram_value(&window, &conv, &w, outputs[0], self.isa, split);
        Ok(())
    }
}
