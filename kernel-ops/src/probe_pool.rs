//! `needle.ProbePool` (`kernels/src/probe_pool.rs` states it): inputs `keep` int64
//! `[batch, sequence]`, `probes` float32 `[layers, k, d]`, `gain` `[layers, k]`, `query`
//! `[q, d]`, `row_bias` `[q, layers, k]` and `past_pools` float32 `[batch, layers · k,
//! d + 2]` (the running pools of the tokens before this call, zeros for none; a tensor of
//! no values: no past), then the cells, one variadic input a layer (the embedding's first),
//! float32 `[batch, sequence, d]` each. Outputs float32 `[batch, q · d]` and, optional,
//! the running pools after this call (`past_pools`' shape).

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::probe_pool::{probe_pool, Cells, PoolState, ProbeWeights};
use kernels::Isa;

pub struct ProbePool {
    isa: Isa,
}

/// The past pools' input.
const PAST_AT: usize = 5;
/// The first of the cells' inputs.
const CELLS_AT: usize = 6;

impl ProbePool {
    /// The cells, the weights and the past pools (`None` where the input holds no values),
    /// checked against each other.
    fn operands<'a>(
        inputs: &[Input<'a>],
    ) -> Result<(Cells<'a>, ProbeWeights<'a>, Option<&'a [f32]>), OpError> {
        let float = |i| Input::get::<Self, f32>(inputs, i);
        let (_, keep) = Input::get::<Self, i64>(inputs, 0)?;
        let (cells_shape, _) = float(CELLS_AT)?;
        let (probes_shape, probes) = float(1)?;
        let (&[batch, sequence, _], &[layers, k, d]) = (cells_shape, probes_shape) else {
            return Err(op_error::<Self>(format!(
                "cells {cells_shape:?} and probes {probes_shape:?} are not [batch, sequence, d] and [layers, k, d]"
            )));
        };
        let layer_cells = (CELLS_AT..inputs.len())
            .map(|i| match float(i)? {
                (shape, cells) if shape == cells_shape => Ok(cells),
                (shape, _) => Err(op_error::<Self>(format!(
                    "cells {shape:?} and {cells_shape:?} differ"
                ))),
            })
            .collect::<Result<_, _>>()?;
        let cells = Cells {
            layers: layer_cells,
            keep,
            batch: batch as usize,
            sequence: sequence as usize,
        };
        let weights = ProbeWeights {
            probes,
            gain: float(2)?.1,
            query: float(3)?.1,
            row_bias: float(4)?.1,
            layers: layers as usize,
            k: k as usize,
            d: d as usize,
        };
        weights.queries(&cells).map_err(op_error::<Self>)?;
        let (past_shape, past) = float(PAST_AT)?;
        let pools = [cells.batch, weights.layers * weights.k, weights.d + 2].map(|n| n as i64);
        let past = match past.len() {
            0 => None,
            _ if past_shape == pools => Some(past),
            _ => {
                return Err(op_error::<Self>(format!(
                    "past pools {past_shape:?} are not {pools:?} (or empty)"
                )))
            }
        };
        Ok((cells, weights, past))
    }
}

impl NeedleOp for ProbePool {
    const NAME: &'static str = needle_ops::PROBE_POOL;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Int64,   // keep
        ElementType::Float32, // probes
        ElementType::Float32, // gain
        ElementType::Float32, // query
        ElementType::Float32, // row_bias
        ElementType::Float32, // past_pools
    ];
    const VARIADIC: Option<ElementType> = Some(ElementType::Float32); // cells
    const OPTIONAL_OUTPUTS: usize = 1; // the running pools after the call

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(ProbePool { isa: Isa::best() })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (cells, weights, _) = Self::operands(inputs)?;
        let q = weights.queries(&cells).map_err(op_error::<Self>)?;
        let pools = weights.layers * weights.k;
        Ok(vec![
            vec![cells.batch as i64, (q * weights.d) as i64],
            [cells.batch, pools, weights.d + 2]
                .map(|n| n as i64)
                .to_vec(),
        ])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        _split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (cells, weights, past) = Self::operands(inputs)?;
        let (out, present) = outputs.split_at_mut(1);
        let state = PoolState {
            past,
            present: present.first_mut().map(|p| &mut **p),
        };
        probe_pool(&cells, &weights, state, out[0], self.isa).map_err(op_error::<Self>)
    }
}
