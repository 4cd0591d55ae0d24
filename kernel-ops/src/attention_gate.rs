//! `needle.AttentionGate` (`kernels/src/attention_gate.rs` states it): inputs `attention`
//! float32 `[batch, sequence, heads · padded]` and the layer's `projections` `[batch,
//! sequence, width]`; attributes `heads`, `head_dim`, `padded`, `offset` (the gate's first
//! column). Output float32 `[batch, sequence, heads · head_dim]`.

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::attention_gate::{attention_gate, GateLayout};

pub struct AttentionGate(GateLayout);

/// The attention output, the projections and their width; the output's shape.
type Operands<'a> = (&'a [f32], &'a [f32], usize, Vec<i64>);

impl AttentionGate {
    /// Both inputs, checked against each other and the layout.
    fn operands<'a>(&self, inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let (a_shape, attention) = Input::get::<Self, f32>(inputs, 0)?;
        let (p_shape, projections) = Input::get::<Self, f32>(inputs, 1)?;
        let (&[batch, sequence, _], &[p_batch, p_sequence, width]) = (a_shape, p_shape) else {
            return Err(op_error::<Self>(format!(
                "attention {a_shape:?} and projections {p_shape:?} are not [batch, sequence, ·]"
            )));
        };
        if (p_batch, p_sequence) != (batch, sequence) {
            return Err(op_error::<Self>(format!(
                "attention {a_shape:?} and projections {p_shape:?} are not one batch and sequence"
            )));
        }
        let width = width as usize;
        self.0
            .tokens(attention.len(), projections.len(), width)
            .map_err(op_error::<Self>)?;
        let shape = vec![batch, sequence, self.0.width() as i64];
        Ok((attention, projections, width, shape))
    }
}

impl NeedleOp for AttentionGate {
    const NAME: &'static str = needle_ops::ATTENTION_GATE;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 2];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        let size = |name| size_attribute::<Self>(attribute, name);
        Ok(AttentionGate(GateLayout {
            heads: size("heads")?,
            head_dim: size("head_dim")?,
            padded: size("padded")?,
            offset: size("offset")?,
        }))
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        self.operands(inputs).map(|(.., shape)| vec![shape])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (attention, projections, width, _) = self.operands(inputs)?;
        attention_gate(attention, projections, width, &self.0, outputs[0], split)
            .map_err(op_error::<Self>)
    }
}
