//! `needle.ProbePool` (`kernels/src/probe_pool.rs` states it): inputs `keep` int64
//! `[batch, sequence]`, `probes` float32 `[layers, k, d]`, `gain` `[layers, k]`, `query`
//! `[q, d]`, `row_bias` `[q, layers, k]` and `past_pools` float32 `[batch, layers · k,
//! d + 2]` (the running pools of the tokens before this call, zeros for none; a tensor of
//! no values: no past), then the cells, one variadic input a layer (the embedding's first),
//! float32 `[batch, sequence, d]` each. Outputs float32 `[batch, q · d]` and, optional,
//! the running pools after this call (`past_pools`' shape).

use crate::{op_error, ElementType, Input, NeedleOp, OpError, RowSplit};
use graphs::contract::needle_ops;
use kernels::probe_pool::{joint_pool, probe_pool, Cells, PoolState, ProbeWeights};
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
        let cells = cells::<Self>(inputs, CELLS_AT)?;
        let (probes_shape, probes) = float(1)?;
        let &[layers, k, d] = probes_shape else {
            return Err(op_error::<Self>(format!(
                "probes {probes_shape:?} are not [layers, k, d]"
            )));
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
        let pools = [cells.batch, weights.layers * weights.k, weights.d + 2];
        let past = past_pools::<Self>(inputs, PAST_AT, pools)?;
        Ok((cells, weights, past))
    }
}

/// The cells from input `at` on (one a layer, `[batch, sequence, d]` each, all alike) and
/// which tokens are kept (input 0).
fn cells<'a, Op: NeedleOp>(inputs: &[Input<'a>], at: usize) -> Result<Cells<'a>, OpError> {
    let (_, keep) = Input::get::<Op, i64>(inputs, 0)?;
    let (first, _) = Input::get::<Op, f32>(inputs, at)?;
    let &[batch, sequence, _] = first else {
        return Err(op_error::<Op>(format!(
            "cells {first:?} are not [batch, sequence, d]"
        )));
    };
    let layers = (at..inputs.len())
        .map(|i| match Input::get::<Op, f32>(inputs, i)? {
            (shape, cells) if shape == first => Ok(cells),
            (shape, _) => Err(op_error::<Op>(format!(
                "cells {shape:?} and {first:?} differ"
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Cells {
        layers,
        keep,
        batch: batch as usize,
        sequence: sequence as usize,
    })
}

/// Input `at`, the running pools before the call: `None` where it holds no values, else
/// checked to be `pools` (`[batch, pools, d + 2]`).
fn past_pools<'a, Op: NeedleOp>(
    inputs: &[Input<'a>],
    at: usize,
    pools: [usize; 3],
) -> Result<Option<&'a [f32]>, OpError> {
    let (shape, past) = Input::get::<Op, f32>(inputs, at)?;
    let pools = pools.map(|n| n as i64);
    match past.len() {
        0 => Ok(None),
        _ if shape == pools => Ok(Some(past)),
        _ => Err(op_error::<Op>(format!(
            "past pools {shape:?} are not {pools:?} (or empty)"
        ))),
    }
}

/// The outputs' shapes of a pooling op: the pooled `[batch, width]`, the running pools.
fn pooled_shapes(batch: usize, width: usize, pools: usize, d: usize) -> Vec<Vec<i64>> {
    vec![
        vec![batch as i64, width as i64],
        [batch, pools, d + 2].map(|n| n as i64).to_vec(),
    ]
}

/// The running pools of `outputs` (the optional second) and `past`.
fn pool_state<'a>(
    past: Option<&'a [f32]>,
    outputs: &'a mut [&mut [f32]],
) -> (&'a mut [f32], PoolState<'a>) {
    let (out, present) = outputs.split_at_mut(1);
    let state = PoolState {
        past,
        present: present.first_mut().map(|p| &mut **p),
    };
    (&mut *out[0], state)
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
        Ok(pooled_shapes(cells.batch, q * weights.d, pools, weights.d))
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        _split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (cells, weights, past) = Self::operands(inputs)?;
        let (out, state) = pool_state(past, outputs);
        probe_pool(&cells, &weights, state, out, self.isa).map_err(op_error::<Self>)
    }
}

/// `needle.JointProbePool` (Needle 2's pooling, `kernels::probe_pool::joint_pool`): inputs
/// `keep` int64 `[batch, sequence]`, `probes` float32 `[P, d]` and `past_pools` float32
/// `[batch, P, d + 2]` (or no values: no past), then the cells, one variadic input a layer
/// (the embedding's first), float32 `[batch, sequence, d]` each. Outputs float32
/// `[batch, P · d]` and, optional, the running pools after the call.
pub struct JointProbePool {
    isa: Isa,
}

impl JointProbePool {
    /// The cells, the probes, `d` and the past pools, checked against each other.
    #[allow(clippy::type_complexity)]
    fn operands<'a>(
        inputs: &[Input<'a>],
    ) -> Result<(Cells<'a>, &'a [f32], usize, Option<&'a [f32]>), OpError> {
        const PAST_AT: usize = 2;
        let cells = cells::<Self>(inputs, PAST_AT + 1)?;
        let (shape, probes) = Input::get::<Self, f32>(inputs, 1)?;
        let &[p, d] = shape else {
            return Err(op_error::<Self>(format!("probes {shape:?} are not [P, d]")));
        };
        let (p, d) = (p as usize, d as usize);
        let values = cells.batch * cells.sequence * d;
        if p * d == 0 || cells.layers.iter().any(|c| c.len() != values) {
            return Err(op_error::<Self>(format!(
                "probes {shape:?} and cells of {:?} values are not [P, d] and [batch, sequence, d]",
                cells.layers.iter().map(|c| c.len()).collect::<Vec<_>>()
            )));
        }
        let past = past_pools::<Self>(inputs, PAST_AT, [cells.batch, p, d + 2])?;
        Ok((cells, probes, d, past))
    }
}

impl NeedleOp for JointProbePool {
    const NAME: &'static str = needle_ops::JOINT_PROBE_POOL;
    const INPUTS: &'static [ElementType] = &[
        ElementType::Int64,   // keep
        ElementType::Float32, // probes
        ElementType::Float32, // past_pools
    ];
    const VARIADIC: Option<ElementType> = Some(ElementType::Float32); // cells
    const OPTIONAL_OUTPUTS: usize = 1; // the running pools after the call

    fn new(_attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError> {
        Ok(JointProbePool { isa: Isa::best() })
    }

    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError> {
        let (cells, probes, d, _) = Self::operands(inputs)?;
        let p = probes.len() / d;
        Ok(pooled_shapes(cells.batch, p * d, p, d))
    }

    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        _split: &dyn RowSplit,
    ) -> Result<(), OpError> {
        let (cells, probes, d, past) = Self::operands(inputs)?;
        let (out, state) = pool_state(past, outputs);
        joint_pool(&cells, probes, d, state, out, self.isa).map_err(op_error::<Self>)
    }
}
