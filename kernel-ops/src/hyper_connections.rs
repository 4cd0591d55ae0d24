//! `needle.HyperConnectionsIn` and `needle.HyperConnectionsOut`
//! (`kernels/src/hyper_connections.rs` states their formulas). Both read the stream `x`
//! float32 `[…, n, C]` and the layer's mixing logits `[…, 2n + n²]` with their `gains` and
//! `bias` `[2n + n²]`. `In` gives the block's input `[…, C]`; `Out` also reads the block's
//! output and input (`[…, C]` each), takes attribute `iterations` (the Sinkhorn steps) and
//! gives the next stream, shaped like `x`. Given the next layer's mixing projection as
//! optional inputs (its CQ `codes`, `norms`, `codebook`, attributes `cols` = n·C, `group`,
//! `bits`), `Out`'s optional second output is the next layer's logits `[…, 2n + n²]`, the
//! product of the new stream's rows (all lanes, each normalised: upstream `_rms_unit`):
//! what a `needle.CqMatMul` with `row_axes` 2 and `unit_rows` 1 gives, one launch fewer.

use crate::cq_matmul::CqLayout;
use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::cq_matmul::RowScale;
use kernels::hyper_connections::{block_input, stream_update, LaneMix};
use kernels::{cq_matmul, CqMatrix, Isa};

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
    /// The next layer's projection's layout, where the node has one.
    next: Option<CqLayout>,
    isa: Isa,
}

/// The first input of the next layer's projection.
const NEXT_AT: usize = 6;

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

impl HyperConnectionsOut {
    /// The next layer's projection, where the node has it, checked against the stream:
    /// its rows are the stream's `n · C` values of a token.
    fn next_projection<'a>(
        &self,
        inputs: &[Input<'a>],
        s: &StreamAndMix,
    ) -> Result<Option<CqMatrix<'a>>, OpError> {
        let (Some(layout), true) = (&self.next, inputs.len() > NEXT_AT) else {
            return Ok(None);
        };
        let w = layout.matrix::<Self>(inputs, NEXT_AT)?;
        let row = s.x_shape[s.x_shape.len() - 2] as usize * s.width;
        if w.cols() != row {
            return Err(op_error::<Self>(format!(
                "the next projection's cols = {} are not the stream's {row} values a token",
                w.cols()
            )));
        }
        Ok(Some(w))
    }
}

impl NeedleOp for HyperConnectionsOut {
    const NAME: &'static str = needle_ops::HYPER_CONNECTIONS_OUT;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32; 6];
    const OPTIONAL_INPUTS: &'static [ElementType] = &[
        ElementType::Uint8,   // the next layer's codes
        ElementType::Float16, // norms
        ElementType::Float32, // codebook
    ];
    const OPTIONAL_OUTPUTS: usize = 1; // the next layer's logits

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        let next = match attribute("cols") {
            Some(_) => Some(CqLayout::of::<Self>(attribute)?),
            None => None,
        };
        Ok(HyperConnectionsOut {
            iterations: size_attribute::<Self>(attribute, "iterations")?,
            next,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let s = stream_and_mix::<Self>(inputs, 3)?;
        Self::block(inputs, s.mix.tokens(), s.width)?;
        let mut shapes = vec![s.x_shape.to_vec()];
        if let Some(w) = self.next_projection(inputs, &s)? {
            let mut logits = s.x_shape[..s.x_shape.len() - 2].to_vec();
            logits.push(w.rows() as i64);
            shapes.push(logits);
        }
        Ok(shapes)
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let s = stream_and_mix::<Self>(inputs, 3)?;
        let [out, u] = Self::block(inputs, s.mix.tokens(), s.width)?;
        let (next, logits) = outputs.split_at_mut(1);
        stream_update(
            &s.mix,
            s.x,
            out,
            u,
            self.iterations,
            next[0],
            self.isa,
            split,
        );
        let Some(logits) = logits.first_mut() else {
            return Ok(());
        };
        let w = self
            .next_projection(inputs, &s)?
            .ok_or_else(|| op_error::<Self>("the next layer's logits need its projection"))?;
        let unit_rows = RowScale {
            unit_rows: true,
            gain: None,
        };
        let tokens = s.mix.tokens();
        cq_matmul(&w, next[0], tokens, unit_rows, logits, self.isa, split);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_inputs::{float, values, SmallMatrix};
    use crate::CqMatMul;

    /// The next layer's logits from `Out` are what `CqMatMul` (`row_axes` 2, `unit_rows` 1)
    /// gives over `Out`'s stream, bit for bit; asking for them without the projection is
    /// an error.
    #[test]
    fn the_next_logits_are_the_unit_rows_product_of_the_new_stream() {
        // Two tokens, 2 lanes of 8; the next projection 4 × 16, 2-bit codes in one group.
        let (x, out, u) = (values(32, 0.3), values(16, 0.2), values(16, 0.1));
        let (logits, gains, bias) = (values(16, 0.05), values(8, 0.4), values(8, 0.07));
        let small = SmallMatrix::new();
        let matrix = small.inputs();
        let mut inputs = vec![
            float(&[1, 2, 2, 8], &x),
            float(&[1, 2, 8], &out),
            float(&[1, 2, 8], &u),
            float(&[1, 2, 8], &logits),
            float(&[8], &gains),
            float(&[8], &bias),
        ];
        let plain = HyperConnectionsOut::new(&|name| (name == "iterations").then_some(20)).unwrap();
        let mut want_next = [f32::NAN; 32];
        plain
            .compute(&inputs, &mut [&mut want_next], &kernels::Serial)
            .unwrap();
        let product = CqMatMul::new(&|name| match name {
            "row_axes" => Some(2),
            "unit_rows" => Some(1),
            _ => SmallMatrix::attribute(name),
        })
        .unwrap();
        let mut product_inputs = vec![float(&[1, 2, 2, 8], &want_next)];
        product_inputs.extend(matrix);
        let mut want_logits = [f32::NAN; 8];
        product
            .compute(&product_inputs, &mut [&mut want_logits], &kernels::Serial)
            .unwrap();

        let fused = HyperConnectionsOut::new(&|name| match name {
            "iterations" => Some(20),
            _ => SmallMatrix::attribute(name),
        })
        .unwrap();
        inputs.extend(matrix);
        assert_eq!(
            fused.output_shapes(&inputs),
            Ok(vec![vec![1, 2, 2, 8], vec![1, 2, 4]])
        );
        let (mut next, mut next_logits) = ([f32::NAN; 32], [f32::NAN; 8]);
        fused
            .compute(
                &inputs,
                &mut [&mut next, &mut next_logits],
                &kernels::Serial,
            )
            .unwrap();
        assert_eq!(next.map(f32::to_bits), want_next.map(f32::to_bits));
        assert_eq!(next_logits.map(f32::to_bits), want_logits.map(f32::to_bits));
        assert!(
            want_logits.iter().any(|&v| v.abs() > 0.1),
            "{want_logits:?}"
        );

        let missing = plain.compute(
            &inputs[..6],
            &mut [&mut next, &mut next_logits],
            &kernels::Serial,
        );
        assert_eq!(
            missing,
            Err(OpError(
                "needle.HyperConnectionsOut: the next layer's logits need its projection".into()
            ))
        );
    }
}
