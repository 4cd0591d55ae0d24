//! `needle.AttentionGate` (`kernels/src/attention_gate.rs` states it), alone and followed
//! by the layer's output projection (`needle.AttentionOut`): inputs `attention`
//! float32 `[batch, sequence, heads · padded]` and the layer's `projections` `[batch,
//! sequence, width]`; attributes `heads`, `head_dim`, `padded`, `offset` (the gate's first
//! column). Output float32 `[batch, sequence, heads · head_dim]`.

use crate::cq_matmul::CqLayout;
use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::attention_gate::{attention_gate, GateLayout};
use kernels::cq_matmul::RowScale;
use kernels::{cq_matmul, Isa};

pub struct AttentionGate(GateLayout);

/// The attention output, the projections and their width; the gated output's shape.
type Operands<'a> = (&'a [f32], &'a [f32], usize, Vec<i64>);

/// The gate's layout from a node's attributes.
fn gate_layout<Op: NeedleOp>(
    attribute: &dyn Fn(&str) -> Option<i64>,
) -> Result<GateLayout, OpError> {
    let size = |name| size_attribute::<Op>(attribute, name);
    Ok(GateLayout {
        heads: size("heads")?,
        head_dim: size("head_dim")?,
        padded: size("padded")?,
        offset: size("offset")?,
    })
}

/// Inputs 0 (the attention output) and 1 (the projections) of `Op`, checked against each
/// other and `layout`.
fn gate_operands<'a, Op: NeedleOp>(
    layout: &GateLayout,
    inputs: &[Input<'a>],
) -> Result<Operands<'a>, OpError> {
    let (a_shape, attention) = Input::get::<Op, f32>(inputs, 0)?;
    let (p_shape, projections) = Input::get::<Op, f32>(inputs, 1)?;
    let (&[batch, sequence, _], &[p_batch, p_sequence, width]) = (a_shape, p_shape) else {
        return Err(op_error::<Op>(format!(
            "attention {a_shape:?} and projections {p_shape:?} are not [batch, sequence, ·]"
        )));
    };
    if (p_batch, p_sequence) != (batch, sequence) {
        return Err(op_error::<Op>(format!(
            "attention {a_shape:?} and projections {p_shape:?} are not one batch and sequence"
        )));
    }
    let width = width as usize;
    layout
        .tokens(attention.len(), projections.len(), width)
        .map_err(op_error::<Op>)?;
    let shape = vec![batch, sequence, layout.width() as i64];
    Ok((attention, projections, width, shape))
}

impl NeedleOp for AttentionGate {
    const NAME: &'static str = needle_ops::ATTENTION_GATE;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 2];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        gate_layout::<Self>(attribute).map(AttentionGate)
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        gate_operands::<Self>(&self.0, inputs).map(|(.., shape)| vec![shape])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (attention, projections, width, _) = gate_operands::<Self>(&self.0, inputs)?;
        attention_gate(attention, projections, width, &self.0, outputs[0], split)
            .map_err(op_error::<Self>)
    }
}

/// `needle.AttentionOut`: `needle.AttentionGate` then the layer's output projection, a
/// `needle.CqMatMul` of the gated heads, in one launch. Inputs `attention` and
/// `projections` as the gate's, then the projection's `codes`, `norms` and `codebook`;
/// the gate's attributes and the product's `cols` (= heads · head_dim), `group`, `bits`.
/// Output float32 `[batch, sequence, rows]`, the bits of the two ops one after the other.
pub struct AttentionOut {
    gate: GateLayout,
    product: CqLayout,
    isa: Isa,
}

impl NeedleOp for AttentionOut {
    const NAME: &'static str = needle_ops::ATTENTION_OUT;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // attention
        ElementType::Float32, // projections
        ElementType::Uint8,   // codes
        ElementType::Float16, // norms
        ElementType::Float32, // codebook
    ];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        let gate = gate_layout::<Self>(attribute)?;
        let product = CqLayout::of::<Self>(attribute)?;
        if product.cols != gate.width() {
            return Err(op_error::<Self>(format!(
                "cols {} is not the gated heads' width {}",
                product.cols,
                gate.width()
            )));
        }
        Ok(AttentionOut {
            gate,
            product,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (.., mut shape) = gate_operands::<Self>(&self.gate, inputs)?;
        let w = self.product.matrix::<Self>(inputs, 2)?;
        shape[2] = w.rows() as i64;
        Ok(vec![shape])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (attention, projections, width, shape) = gate_operands::<Self>(&self.gate, inputs)?;
        let w = self.product.matrix::<Self>(inputs, 2)?;
        let tokens = (shape[0] * shape[1]) as usize;
        let mut gated = vec![0.0f32; tokens * self.gate.width()];
        attention_gate(attention, projections, width, &self.gate, &mut gated, split)
            .map_err(op_error::<Self>)?;
        let scale = RowScale::default();
        cq_matmul(&w, &gated, tokens, scale, outputs[0], self.isa, split);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_inputs::{float, values, SmallMatrix};
    use crate::CqMatMul;

    /// `AttentionOut` gives what `AttentionGate` then `CqMatMul` give, bit for bit, and
    /// refuses a product whose width is not the gated heads'.
    #[test]
    fn attention_out_is_the_gate_then_the_product() {
        // Two tokens; 2 heads of 8 padded to 8 (the gate after 16 columns of 32), then a
        // 4 × 16 projection of 2-bit codes in one group.
        let (attention, projections) = (values(32, 0.3), values(64, 0.2));
        let small = SmallMatrix::new();
        let attribute = |name: &str| match name {
            "heads" => Some(2),
            "head_dim" | "padded" => Some(8),
            "offset" => Some(16),
            _ => SmallMatrix::attribute(name),
        };
        let heads = [
            float(&[1, 2, 16], &attention),
            float(&[1, 2, 32], &projections),
        ];
        let matrix = small.inputs();
        let mut gated = [f32::NAN; 32];
        AttentionGate::new(&attribute)
            .unwrap()
            .compute(&heads, &mut [&mut gated], &kernels::Serial)
            .unwrap();
        let mut product_inputs = vec![float(&[1, 2, 16], &gated)];
        product_inputs.extend(matrix);
        let mut want = [f32::NAN; 8];
        CqMatMul::new(&attribute)
            .unwrap()
            .compute(&product_inputs, &mut [&mut want], &kernels::Serial)
            .unwrap();

        let fused = AttentionOut::new(&attribute).unwrap();
        let inputs: Vec<Input> = heads.into_iter().chain(matrix).collect();
        assert_eq!(fused.output_shapes(&inputs), Ok(vec![vec![1, 2, 4]]));
        let mut got = [f32::NAN; 8];
        fused
            .compute(&inputs, &mut [&mut got], &kernels::Serial)
            .unwrap();
        assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits));
        assert!(want.iter().any(|&v| v.abs() > 0.1), "{want:?}");

        let narrow = AttentionOut::new(&|name| match name {
            "cols" => Some(8),
            _ => attribute(name),
        });
        assert!(narrow.is_err_and(|e| e.0.contains("cols 8 is not the gated heads' width 16")));
    }
}
