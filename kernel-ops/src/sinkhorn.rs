//! `needle.Sinkhorn` (`kernels/src/sinkhorn.rs` states its contract): input `logits`
//! float32 `[…, n, n]`, attribute `iterations`; output float32, the same shape.

use crate::{op_error, size_attribute, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::{sinkhorn, Isa};

pub struct Sinkhorn {
    iterations: usize,
    isa: Isa,
}

impl Sinkhorn {
    /// The logits and their matrices' size `n`.
    fn logits<'a>(inputs: &[Input<'a>]) -> Result<(&'a [i64], &'a [f32], usize), OpError> {
        let (shape, logits) = Input::get::<Self, f32>(inputs, 0)?;
        match shape {
            [.., rows, cols] if rows == cols && *rows > 0 => Ok((shape, logits, *rows as usize)),
            _ => Err(op_error::<Self>(format!(
                "logits are {shape:?}, not [.., n, n]"
            ))),
        }
    }
}

impl NeedleOp for Sinkhorn {
    const NAME: &'static str = needle_ops::SINKHORN;
    const INPUTS: &'static [ElementType] = &[ElementType::Float32];

    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(Sinkhorn {
            iterations: size_attribute::<Self>(attribute, "iterations")?,
            isa: Isa::best(),
        })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        Self::logits(inputs).map(|(shape, _, _)| vec![shape.to_vec()])
    }

    /// The matrices are tiny (n = the lanes), so `split` is not used.
    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        _split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (_, logits, n) = Self::logits(inputs)?;
        sinkhorn(self.isa, logits, n, self.iterations, outputs[0]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InputData;

    #[test]
    fn logits_must_be_square_matrices() {
        let op = Sinkhorn::new(&|_| Some(20)).unwrap();
        let logits = [0.0; 18];
        let input = |shape| {
            [Input {
                shape,
                data: InputData::Float32(&logits),
            }]
        };
        assert_eq!(
            op.output_shapes(&input(&[2, 3, 3])),
            Ok(vec![vec![2, 3, 3]])
        );
        assert_eq!(
            op.output_shapes(&input(&[2, 9])),
            Err(OpError(
                "needle.Sinkhorn: logits are [2, 9], not [.., n, n]".into()
            ))
        );
    }
}
