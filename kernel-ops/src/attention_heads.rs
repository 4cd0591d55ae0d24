//! `needle.QkHeads` and `needle.VHeads` (`kernels/src/attention_heads.rs` states them):
//! inputs `projections` float32 `[batch, sequence, width]`, the conv `state`
//! `[batch, taps − 1, conv width]` and `taps` `[taps, conv width]`; `QkHeads` also the norm
//! `gain` `[head_dim]`, the rotary `cos` and `sin` tables `[positions, head_dim / 2]` and
//! `position_ids` int64 `[batch, sequence]`. Attributes `offset`, `heads`, `head_dim`,
//! `padded`, `visible_taps`. Output float32 `[batch, sequence, heads · padded]`.

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::attention_heads::{attention_heads, ConvInputs, HeadsLayout, NormRope};

fn layout<Op: NeedleOp>(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<HeadsLayout, OpError> {
    let size = |name| size_attribute::<Op>(attribute, name);
    Ok(HeadsLayout {
        offset: size("offset")?,
        heads: size("heads")?,
        head_dim: size("head_dim")?,
        padded: size("padded")?,
        visible_taps: size("visible_taps")?,
    })
}

/// The conv's inputs (0, 1, 2) of `Op`, checked against `layout` and `norm_rope`.
fn conv_inputs<'a, Op: NeedleOp>(
    inputs: &[Input<'a>],
    layout: &HeadsLayout,
    norm_rope: Option<&NormRope>,
) -> Result<ConvInputs<'a>, OpError> {
    let (p_shape, projections) = Input::get::<Op, f32>(inputs, 0)?;
    let (_, state) = Input::get::<Op, f32>(inputs, 1)?;
    let (taps_shape, taps) = Input::get::<Op, f32>(inputs, 2)?;
    let ([batch, sequence, width], [_, conv_width]) = (p_shape, taps_shape) else {
        return Err(op_error::<Op>(format!(
            "projections {p_shape:?} and taps {taps_shape:?} are not [batch, sequence, width] and [taps, conv width]"
        )));
    };
    let conv = ConvInputs {
        projections,
        projections_width: *width as usize,
        state,
        taps,
        conv_width: *conv_width as usize,
        batch: *batch as usize,
        sequence: *sequence as usize,
    };
    conv.check(layout, norm_rope).map_err(op_error::<Op>)?;
    Ok(conv)
}

fn output_shape(conv: &ConvInputs, layout: &HeadsLayout) -> Vec<i64> {
    let row = layout.heads * layout.padded;
    [conv.batch, conv.sequence, row].map(|d| d as i64).to_vec()
}

/// Query or key heads: conv, ZC-RMS norm, RoPE, padding.
pub struct QkHeads(HeadsLayout);

impl QkHeads {
    fn norm_rope<'a>(inputs: &[Input<'a>]) -> Result<NormRope<'a>, OpError> {
        let float = |i| Input::get::<Self, f32>(inputs, i).map(|(_, d)| d);
        Ok(NormRope {
            gain: float(3)?,
            cos: float(4)?,
            sin: float(5)?,
            positions: Input::get::<Self, i64>(inputs, 6)?.1,
        })
    }
}

impl NeedleOp for QkHeads {
    const NAME: &'static str = needle_ops::QK_HEADS;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // projections
        ElementType::Float32, // state
        ElementType::Float32, // taps
        ElementType::Float32, // gain
        ElementType::Float32, // cos
        ElementType::Float32, // sin
        ElementType::Int64,   // position_ids
    ];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        layout::<Self>(attribute).map(QkHeads)
    }

    fn output_shape(&self, inputs: &[Input]) -> Result<Vec<i64>, OpError> {
        let norm_rope = Self::norm_rope(inputs)?;
        let conv = conv_inputs::<Self>(inputs, &self.0, Some(&norm_rope))?;
        Ok(output_shape(&conv, &self.0))
    }

    fn compute(
        &self,
        inputs: &[Input],
        output: &mut [f32],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let norm_rope = Self::norm_rope(inputs)?;
        let conv = conv_inputs::<Self>(inputs, &self.0, Some(&norm_rope))?;
        attention_heads(&conv, &self.0, Some(&norm_rope), output, split);
        Ok(())
    }
}

/// Value heads: conv and padding.
pub struct VHeads(HeadsLayout);

impl NeedleOp for VHeads {
    const NAME: &'static str = needle_ops::V_HEADS;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 3];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        layout::<Self>(attribute).map(VHeads)
    }

    fn output_shape(&self, inputs: &[Input]) -> Result<Vec<i64>, OpError> {
        let conv = conv_inputs::<Self>(inputs, &self.0, None)?;
        Ok(output_shape(&conv, &self.0))
    }

    fn compute(
        &self,
        inputs: &[Input],
        output: &mut [f32],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let conv = conv_inputs::<Self>(inputs, &self.0, None)?;
        attention_heads(&conv, &self.0, None, output, split);
        Ok(())
    }
}
