//! `needle.QkvHeads` (`kernels/src/attention_heads.rs` states it): inputs `projections`
//! float32 `[batch, sequence, width]`, the conv `state` `[batch, taps − 1, conv width]`,
//! `taps` `[taps, conv width]`, the query and key norms' gains `q_gain`, `k_gain`
//! `[qk_head_dim]`, the rotary `cos` and `sin` tables `[positions, qk_head_dim / 2]` and
//! `position_ids` int64 `[batch, sequence]`. Attributes `heads`, `kv_heads`,
//! `qk_head_dim`, `v_head_dim`, `padded`, `visible_taps`; the conv's columns are the
//! queries', the keys' and the values' in that order. Output float32 `[batch, sequence,
//! (heads + 2 · kv_heads) · padded]`: `GroupQueryAttention`'s packed query, key and value.

use crate::conv_state::same_batch;
use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::attention_heads::{attention_heads, ConvInputs, HeadsLayout, HeadsPart, NormRope};
use kernels::conv_state::{conv_state, ConvWindow};

/// The three parts' layouts: queries, keys, values.
pub struct QkvHeads([HeadsLayout; 3]);

impl QkvHeads {
    /// The conv's inputs and the three parts, each checked against the others.
    fn operands<'a>(
        &self,
        inputs: &[Input<'a>],
    ) -> Result<(ConvInputs<'a>, [HeadsPart<'a>; 3]), OpError> {
        let float = |i| Input::get::<Self, f32>(inputs, i);
        let (p_shape, projections) = float(0)?;
        let (_, state) = float(1)?;
        let (taps_shape, taps) = float(2)?;
        let ([batch, sequence, width], [_, conv_width]) = (p_shape, taps_shape) else {
            return Err(op_error::<Self>(format!(
                "projections {p_shape:?} and taps {taps_shape:?} are not [batch, sequence, width] and [taps, conv width]"
            )));
        };
        let conv = ConvInputs {
            window: ConvWindow {
                state,
                projections,
                projections_width: *width as usize,
                batch: *batch as usize,
                sequence: *sequence as usize,
                width: *conv_width as usize,
            },
            taps,
        };
        let norm_rope = |gain| -> Result<NormRope<'a>, OpError> {
            Ok(NormRope {
                gain: float(gain)?.1,
                cos: float(5)?.1,
                sin: float(6)?.1,
                positions: Input::get::<Self, i64>(inputs, 7)?.1,
            })
        };
        let [q, k, v] = self.0;
        let parts = [
            HeadsPart {
                layout: q,
                norm_rope: Some(norm_rope(3)?),
            },
            HeadsPart {
                layout: k,
                norm_rope: Some(norm_rope(4)?),
            },
            HeadsPart {
                layout: v,
                norm_rope: None,
            },
        ];
        for part in &parts {
            conv.check(&part.layout, part.norm_rope.as_ref())
                .map_err(op_error::<Self>)?;
        }
        Ok((conv, parts))
    }
}

impl NeedleOp for QkvHeads {
    const NAME: &'static str = needle_ops::QKV_HEADS;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // projections
        ElementType::Float32, // state
        ElementType::Float32, // taps
        ElementType::Float32, // q_gain
        ElementType::Float32, // k_gain
        ElementType::Float32, // cos
        ElementType::Float32, // sin
        ElementType::Int64,   // position_ids
    ];
    const OPTIONAL_INPUTS: &'static [ElementType] = &[ElementType::Int64]; // real_new
    const OPTIONAL_OUTPUTS: usize = 1; // the next conv state

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        let size = |name| size_attribute::<Self>(attribute, name);
        let (heads, kv_heads) = (size("heads")?, size("kv_heads")?);
        let (qk, v) = (size("qk_head_dim")?, size("v_head_dim")?);
        let (padded, visible_taps) = (size("padded")?, size("visible_taps")?);
        let part = |offset, heads, head_dim| HeadsLayout {
            offset,
            heads,
            head_dim,
            padded,
            visible_taps,
        };
        Ok(QkvHeads([
            part(0, heads, qk),
            part(heads * qk, kv_heads, qk),
            part((heads + kv_heads) * qk, kv_heads, v),
        ]))
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (conv, parts) = self.operands(inputs)?;
        let row: usize = parts.iter().map(HeadsPart::width).sum();
        let heads = [conv.window.batch, conv.window.sequence, row].map(|d| d as i64);
        Ok(vec![heads.to_vec(), inputs[1].shape.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (conv, parts) = self.operands(inputs)?;
        attention_heads(&conv, &parts, outputs[0], split);
        let Some(next) = outputs.get_mut(1) else {
            return Ok(());
        };
        let Some((_, real_new)) = Input::optional::<Self, i64>(inputs, 8)? else {
            return Err(op_error::<Self>("the next conv state needs real_new"));
        };
        same_batch::<Self>(inputs[0].shape, inputs[1].shape)?;
        conv_state(&conv.window, real_new, next).map_err(op_error::<Self>)
    }
}
