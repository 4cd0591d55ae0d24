//! `needle.HyperConnectionsIn` and `needle.HyperConnectionsOut`
//! (`kernels/src/hyper_connections.rs` states their formulas). Both read the stream `x`
//! float32 `[…, n, C]` and the layer's mixing logits `[…, 2n + n²]` with their `gains` and
//! `bias` `[2n + n²]`. `In` gives the block's input `[…, C]`; `Out` also reads the block's
//! output and input (`[…, C]` each), takes attribute `iterations` (the Sinkhorn steps) and
//! gives the next stream, shaped like `x`.

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::hyper_connections::{block_input, stream_update, LaneMix};

/// The stream `x` with its shape and width, and the layer's mixes.
struct StreamAndMix<'a> {
    x_shape: &'a [i64],
    x: &'a [f32],
    width: usize,
    mix: LaneMix<'a>,
}

/// The stream and the layer's mixes, checked against each other; the stream at input 0,
/// the logits, gains and bias at `mix_at..mix_at + 3`.
fn stream_and_mix<'a, Op: NeedleOp>(
    inputs: &[Input<'a>],
    mix_at: usize,
) -> Result<StreamAndMix<'a>, OpError> {
    let (x_shape, x) = Input::get::<Op, f32>(inputs, 0)?;
    let (logits_shape, logits) = Input::get::<Op, f32>(inputs, mix_at)?;
    let (_, gains) = Input::get::<Op, f32>(inputs, mix_at + 1)?;
    let (_, bias) = Input::get::<Op, f32>(inputs, mix_at + 2)?;
    let [leading @ .., lanes, width] = x_shape else {
        return Err(op_error::<Op>(format!("x is {x_shape:?}, not [.., n, C]")));
    };
    if logits_shape.split_last().map(|(_, l)| l) != Some(leading) {
        return Err(op_error::<Op>(format!(
            "logits are {logits_shape:?}, x {x_shape:?}: their leading axes differ"
        )));
    }
    let mix = LaneMix::new(*lanes as usize, logits, gains, bias).map_err(op_error::<Op>)?;
    Ok(StreamAndMix {
        x_shape,
        x,
        width: *width as usize,
        mix,
    })
}

/// The block's input `u` from the stream.
pub struct HyperConnectionsIn;

impl NeedleOp for HyperConnectionsIn {
    const NAME: &'static str = needle_ops::HYPER_CONNECTIONS_IN;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 4];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(HyperConnectionsIn)
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let mut shape = stream_and_mix::<Self>(inputs, 1)?.x_shape.to_vec();
        shape.remove(shape.len() - 2);
        Ok(vec![shape])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let s = stream_and_mix::<Self>(inputs, 1)?;
        block_input(&s.mix, s.x, outputs[0], split);
        Ok(())
    }
}

/// The next stream from the stream and the block's output and input.
pub struct HyperConnectionsOut {
    iterations: usize,
}

impl HyperConnectionsOut {
    /// The block's output and input, each `[.., C]` as the stream's tokens.
    fn block<'a>(
        inputs: &[Input<'a>],
        tokens: usize,
        width: usize,
    ) -> Result<[&'a [f32]; 2], OpError> {
        let [out, u] = [1, 2].map(|i| Input::get::<Self, f32>(inputs, i).map(|(_, d)| d));
        let (out, u) = (out?, u?);
        if out.len() != tokens * width || u.len() != tokens * width {
            return Err(op_error::<Self>(format!(
                "the block's output and input hold {} and {} values, not {tokens} tokens of {width}",
                out.len(),
                u.len()
            )));
        }
        Ok([out, u])
    }
}

impl NeedleOp for HyperConnectionsOut {
    const NAME: &'static str = needle_ops::HYPER_CONNECTIONS_OUT;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 6];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(HyperConnectionsOut {
            iterations: size_attribute::<Self>(attribute, "iterations")?,
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let s = stream_and_mix::<Self>(inputs, 3)?;
        Self::block(inputs, s.mix.tokens(), s.width)?;
        Ok(vec![s.x_shape.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let s = stream_and_mix::<Self>(inputs, 3)?;
        let [out, u] = Self::block(inputs, s.mix.tokens(), s.width)?;
        stream_update(&s.mix, s.x, out, u, self.iterations, outputs[0], split);
        Ok(())
    }
}
