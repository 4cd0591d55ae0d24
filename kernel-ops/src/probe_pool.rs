//! `needle.ProbePool` (`kernels/src/probe_pool.rs` states it): inputs `cells` float32
//! `[batch, sequence, layers, d]`, `keep` int64 `[batch, sequence]`, `probes` `[layers, k,
//! d]`, `gain` `[layers, k]`, `query` `[q, d]` and `row_bias` `[q, layers, k]`. Output
//! float32 `[batch, q · d]`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::probe_pool::{probe_pool, Cells, ProbeWeights};
use kernels::Isa;

pub struct ProbePool {
    isa: Isa,
}

impl ProbePool {
    /// The cells and the weights, checked against each other.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<(Cells<'a>, ProbeWeights<'a>), OpError> {
        let float = |i| Input::get::<Self, f32>(inputs, i);
        let (cells_shape, cells) = float(0)?;
        let (_, keep) = Input::get::<Self, i64>(inputs, 1)?;
        let (probes_shape, probes) = float(2)?;
        let (&[batch, sequence, _, _], &[layers, k, d]) = (cells_shape, probes_shape) else {
            return Err(op_error::<Self>(format!(
                "cells {cells_shape:?} and probes {probes_shape:?} are not [batch, sequence, layers, d] and [layers, k, d]"
            )));
        };
        let cells = Cells {
            cells,
            keep,
            batch: batch as usize,
            sequence: sequence as usize,
        };
        let weights = ProbeWeights {
            probes,
            gain: float(3)?.1,
            query: float(4)?.1,
            row_bias: float(5)?.1,
            layers: layers as usize,
            k: k as usize,
            d: d as usize,
        };
        weights.queries(&cells).map_err(op_error::<Self>)?;
        Ok((cells, weights))
    }
}

impl NeedleOp for ProbePool {
    const NAME: &'static str = needle_ops::PROBE_POOL;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Float32, // cells
        ElementType::Int64,   // keep
        ElementType::Float32, // probes
        ElementType::Float32, // gain
        ElementType::Float32, // query
        ElementType::Float32, // row_bias
    ];

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(ProbePool { isa: Isa::best() })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (cells, weights) = Self::operands(inputs)?;
        let q = weights.queries(&cells).map_err(op_error::<Self>)?;
        Ok(vec![vec![cells.batch as i64, (q * weights.d) as i64]])
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (cells, weights) = Self::operands(inputs)?;
        probe_pool(&cells, &weights, outputs[0], self.isa, split).map_err(op_error::<Self>)
    }
}
