//! `needle.ProbePool` (`kernels/src/probe_pool.rs` states it): inputs `keep` int64
//! `[batch, sequence]`, `probes` float32 `[layers, k, d]`, `gain` `[layers, k]`, `query`
//! `[q, d]` and `row_bias` `[q, layers, k]`, then the cells, one variadic input a layer
//! (the embedding's first), float32 `[batch, sequence, d]` each. Output float32
//! `[batch, q · d]`.

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::probe_pool::{probe_pool, Cells, ProbeWeights};
use kernels::Isa;

pub struct ProbePool {
    isa: Isa,
}

/// The first of the cells' inputs.
const CELLS_AT: usize = 5;

impl ProbePool {
    /// The cells and the weights, checked against each other.
    fn operands<'a>(inputs: &[Input<'a>]) -> Result<(Cells<'a>, ProbeWeights<'a>), OpError> {
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
        Ok((cells, weights))
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
    ];
    const VARIADIC: Option<ElementType> = Some(ElementType::Float32); // cells

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
