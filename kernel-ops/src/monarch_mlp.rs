//! `needle.MonarchMlp` (`kernels/src/monarch_mlp.rs` states its formula): inputs `x`
//! float32 `[…, d_model]`, `cond_v` `[d_model, rank]`, `cond_u` `[rank, n]`, `d1`, `d2`,
//! `b2`, `d3`, `d4` `[n]`, then `Aᵀ` `[a, a]` and `B` `[b, b]` of stages 1, 2 and 3, then
//! `p1`, `p2` int64 `[n]`, then the pre-MLP norm's `gain` `[d_model]`; output float32 shaped
//! like `x`: the layer's MLP half, `x + mlp(norm(x))`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::monarch_mlp::{KronFactors, MonarchMlp as Mlp};
use kernels::Isa;

/// The layer's MLP, `x`'s shape and elements, the norm's gain.
type Operands<'a> = (Mlp<'a>, &'a [i64], &'a [f32], &'a [f32]);

pub struct MonarchMlp {
    isa: Isa,
}

impl MonarchMlp {
    /// The layer's MLP, `x` with its shape and the norm's gain, checked against each other.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<Operands<'a>, OpError> {
        let float = |i| Input::get::<Self, f32>(inputs, i).map(|(_, data)| data);
        let (x_shape, x) = Input::get::<Self, f32>(inputs, 0)?;
        let (cond_v_shape, cond_v) = Input::get::<Self, f32>(inputs, 1)?;
        let d_model = match cond_v_shape {
            [d_model, _] => *d_model as usize,
            _ => {
                return Err(op_error::<Self>(format!(
                    "cond_v is {cond_v_shape:?}, not [d_model, rank]"
                )))
            }
        };
        let stage = |i| -> Result<KronFactors<'a>, OpError> {
            Ok(KronFactors {
                a_t: float(i)?,
                b: float(i + 1)?,
            })
        };
        let permutation = |i| Input::get::<Self, i64>(inputs, i).map(|(_, data)| data);
        let mlp = Mlp::new(
            d_model,
            cond_v,
            float(2)?,
            [float(3)?, float(4)?, float(6)?, float(7)?],
            float(5)?,
            [stage(8)?, stage(10)?, stage(12)?],
            [permutation(14)?, permutation(15)?],
        )
        .map_err(op_error::<Self>)?;
        let gain = float(16)?;
        if x_shape.last().copied() != Some(d_model as i64) || gain.len() != d_model {
            return Err(op_error::<Self>(format!(
                "x is {x_shape:?} and the gain holds {}: both must be d_model = {d_model} wide",
                gain.len()
            )));
        }
        Ok((mlp, x_shape, x, gain))
    }
}

impl NeedleOp for MonarchMlp {
    const NAME: &'static str = needle_ops::MONARCH_MLP;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // x
        ElementType::Float32, // cond_v
        ElementType::Float32, // cond_u
        ElementType::Float32, // d1
        ElementType::Float32, // d2
        ElementType::Float32, // b2
        ElementType::Float32, // d3
        ElementType::Float32, // d4
        ElementType::Float32, // stage 1 Aᵀ
        ElementType::Float32, // stage 1 B
        ElementType::Float32, // stage 2 Aᵀ
        ElementType::Float32, // stage 2 B
        ElementType::Float32, // stage 3 Aᵀ
        ElementType::Float32, // stage 3 B
        ElementType::Int64,   // p1
        ElementType::Int64,   // p2
        ElementType::Float32, // gain
    ];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(MonarchMlp { isa: Isa::best() })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        Self::operands(inputs).map(|(_, x_shape, ..)| vec![x_shape.to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (mlp, _, x, gain) = Self::operands(inputs)?;
        mlp.apply(x, gain, outputs[0], self.isa, split);
        Ok(())
    }
}
