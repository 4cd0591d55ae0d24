//! The Needle op domain as onnxruntime sees it, written once without onnxruntime's types:
//! each op's name, input types, attributes, the checks of its tensors' shapes and its
//! compute over the `kernels` crate. Two thin adapters register it with onnxruntime:
//! `needle-run`'s in-process domain (`runner/src/needle_ops.rs`, through the `ort` crate)
//! and the library any onnxruntime loads (`kernel-library/`, through the raw C API).

mod attention;
mod attention_gate;
mod attention_heads;
mod conv_state;
mod cq_gather;
mod cq_matmul;
mod engram_gate;
mod engram_rows;
mod engram_value;
mod hadamard_mlp;
mod hyper_connections;
mod monarch_mlp;
mod probe_pool;
mod residual_norm;
mod sinkhorn;

pub use attention::Attention;
pub use attention_gate::{AttentionGate, AttentionOut};
pub use attention_heads::QkvHeads;
pub use conv_state::ConvState;
pub use cq_gather::CqGather;
pub use cq_matmul::CqMatMul;
pub use engram_gate::EngramGate;
pub use engram_rows::EngramRows;
pub use engram_value::EngramValue;
pub use graphs::contract::needle_ops::DOMAIN;
pub use hadamard_mlp::HadamardMlp;
pub use hyper_connections::{HyperConnectionsIn, HyperConnectionsOut};
pub use kernels::RowSplit;
pub use monarch_mlp::MonarchMlp;
pub use probe_pool::{JointProbePool, ProbePool};
pub use residual_norm::ResidualNorm;
pub use sinkhorn::Sinkhorn;

/// The element type of a tensor an op reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementType {
    Float32,
    Uint8,
    Float16,
    Int64,
}

/// Every output of every op of the domain is of this type.
pub const OUTPUT_TYPE: ElementType = ElementType::Float32;

/// One input tensor as the host hands it over: its shape and its elements.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub shape: &'a [i64],
    pub data: InputData<'a>,
}

/// An input's elements, typed as the op declares them (float16 as its bits).
#[derive(Clone, Copy, Debug)]
pub enum InputData<'a> {
    Float32(&'a [f32]),
    Uint8(&'a [u8]),
    Float16(&'a [u16]),
    Int64(&'a [i64]),
}

/// A tensor's shape and elements.
type Shaped<'a, T> = (&'a [i64], &'a [T]);

impl<'a> Input<'a> {
    /// The shape and the elements of input `index` of `Op`'s `inputs`, as `T`.
    fn get<Op: NeedleOp, T: Element>(
        inputs: &[Input<'a>],
        index: usize,
    ) -> Result<Shaped<'a, T>, OpError> {
        let input = inputs
            .get(index)
            .ok_or_else(|| op_error::<Op>(format!("input {index} missing")))?;
        let data = T::of(input.data)
            .ok_or_else(|| op_error::<Op>(format!("input {index} is not {:?}", T::TYPE)))?;
        Ok((input.shape, data))
    }

    /// Optional input `index` of `Op`'s `inputs`, as `T`: `None` where the node has none.
    fn optional<Op: NeedleOp, T: Element>(
        inputs: &[Input<'a>],
        index: usize,
    ) -> Result<Option<Shaped<'a, T>>, OpError> {
        match index < inputs.len() {
            true => Input::get::<Op, T>(inputs, index).map(Some),
            false => Ok(None),
        }
    }
}

/// A Rust type that an [`ElementType`] is read as.
trait Element: Sized {
    const TYPE: ElementType;
    fn of(data: InputData<'_>) -> Option<&[Self]>;
}

impl Element for f32 {
    const TYPE: ElementType = ElementType::Float32;
    fn of(data: InputData<'_>) -> Option<&[f32]> {
        match data {
            InputData::Float32(d) => Some(d),
            _ => None,
        }
    }
}

impl Element for u8 {
    const TYPE: ElementType = ElementType::Uint8;
    fn of(data: InputData<'_>) -> Option<&[u8]> {
        match data {
            InputData::Uint8(d) => Some(d),
            _ => None,
        }
    }
}

impl Element for i64 {
    const TYPE: ElementType = ElementType::Int64;
    fn of(data: InputData<'_>) -> Option<&[i64]> {
        match data {
            InputData::Int64(d) => Some(d),
            _ => None,
        }
    }
}

/// float16, as its bits.
impl Element for u16 {
    const TYPE: ElementType = ElementType::Float16;
    fn of(data: InputData<'_>) -> Option<&[u16]> {
        match data {
            InputData::Float16(d) => Some(d),
            _ => None,
        }
    }
}

/// Why an op cannot be created or run: one line naming the op, for onnxruntime's error.
#[derive(Debug, PartialEq)]
pub struct OpError(pub String);

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpError {}

/// The message, for hosts whose errors are strings.
impl From<OpError> for String {
    fn from(e: OpError) -> String {
        e.0
    }
}

/// One op of the domain. A host adapter declares [`NeedleOp::INPUTS`] (required), then
/// [`NeedleOp::OPTIONAL_INPUTS`] or, where [`NeedleOp::VARIADIC`] names a type, any number
/// ≥ 1 more inputs of it; and [`NeedleOp::OUTPUTS`] required and
/// [`NeedleOp::OPTIONAL_OUTPUTS`] optional [`OUTPUT_TYPE`] outputs. It creates the kernel
/// from the node's integer attributes, and on every call allocates the outputs the node
/// names, shaped as [`NeedleOp::output_shapes`] says, before [`NeedleOp::compute`] fills
/// them. An optional input or output a node leaves out is one it leaves out at the end.
pub trait NeedleOp: Sized + Send + Sync + 'static {
    /// The op's name in [`DOMAIN`].
    const NAME: &'static str;
    /// The element type of each input, in order.
    const INPUTS: &'static [ElementType];
    /// The element types of the optional inputs after [`NeedleOp::INPUTS`], in order.
    const OPTIONAL_INPUTS: &'static [ElementType] = &[];
    /// The element type of the variadic inputs after [`NeedleOp::INPUTS`], for an op
    /// that takes one tensor of each of a varying number of layers.
    const VARIADIC: Option<ElementType> = None;
    /// How many outputs every node of the op has.
    const OUTPUTS: usize = 1;
    /// How many optional outputs may follow them.
    const OPTIONAL_OUTPUTS: usize = 0;
    /// `(input, output)` pairs the host may give the same memory (a cache bound as both
    /// past and present, updated in place): it then hands the op that input with no
    /// elements (its shape kept, [`unalias`]), and the op reads it from the output.
    const IN_PLACE: &'static [(usize, usize)] = &[];

    /// The kernel of one node, from its integer attributes (`attribute(name)`, `None` where
    /// the node has none).
    fn new(attribute: &dyn Fn(&str) -> Option<i64>) -> Result<Self, OpError>;

    /// Each output's shape for `inputs` (typed as declared), every shape checked: the
    /// optional outputs' too, of which hosts allocate those the node names.
    fn output_shapes(&self, inputs: &[Input]) -> Result<Vec<Vec<i64>>, OpError>;

    /// Fills `outputs` from `inputs`, their independent blocks spread by `split`. They are
    /// the node's outputs, [`NeedleOp::OUTPUTS`] or more, each holding exactly the values
    /// [`NeedleOp::output_shapes`] names for these inputs: hosts call this through
    /// [`compute`], which checks that once for every op.
    fn compute(
        &self,
        inputs: &[Input],
        outputs: &mut [&mut [f32]],
        split: &dyn RowSplit,
    ) -> Result<(), OpError>;
}

/// Runs `op` over `inputs` into `outputs`, which the host allocated as the first of
/// `shapes` (what [`NeedleOp::output_shapes`] gave for the same inputs): the one check that
/// they agree, so that no op's kernel writes past or short of an output.
pub fn compute<Op: NeedleOp>(
    op: &Op,
    inputs: &[Input],
    shapes: &[Vec<i64>],
    outputs: &mut [&mut [f32]],
    split: &dyn RowSplit,
) -> Result<(), OpError> {
    let counts = Op::OUTPUTS..=Op::OUTPUTS + Op::OPTIONAL_OUTPUTS;
    if !counts.contains(&outputs.len()) || shapes.len() < outputs.len() {
        return Err(op_error::<Op>(format!(
            "{} outputs of {} shapes, not {counts:?}",
            outputs.len(),
            shapes.len(),
        )));
    }
    for (shape, output) in shapes.iter().zip(outputs.iter()) {
        let values = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
        if values != Some(output.len()) {
            return Err(op_error::<Op>(format!(
                "an output holds {} values, not the {shape:?} its shape names",
                output.len()
            )));
        }
    }
    op.compute(inputs, outputs, split)
}

/// Empties each input of `Op::IN_PLACE` whose elements are its output's memory, so that
/// no input borrows what the op writes (the host calls this before the op runs, and holds
/// no other borrow of such an input's elements).
pub fn unalias<Op: NeedleOp>(inputs: &mut [Input], outputs: &[&mut [f32]]) {
    for &(i, o) in Op::IN_PLACE {
        let (Some(input), Some(output)) = (inputs.get_mut(i), outputs.get(o)) else {
            continue;
        };
        if let InputData::Float32(data) = input.data {
            if !data.is_empty() && std::ptr::eq(data.as_ptr(), output.as_ptr()) {
                input.data = InputData::Float32(&[]);
            }
        }
    }
}

/// The element types of `Op`'s inputs when a node gives it `count`: [`NeedleOp::INPUTS`],
/// then as many of the optional ones, or the variadic type for the rest; the error that
/// says so for a count the op does not take.
pub fn input_types<Op: NeedleOp>(count: usize) -> Result<Vec<ElementType>, OpError> {
    let more = match (count.checked_sub(Op::INPUTS.len()), Op::VARIADIC) {
        (Some(extra @ 1..), Some(t)) => Some(vec![t; extra]),
        (Some(extra), None) => Op::OPTIONAL_INPUTS.get(..extra).map(<[_]>::to_vec),
        _ => None,
    };
    let more =
        more.ok_or_else(|| op_error::<Op>(format!("{count} inputs is not a count it takes")))?;
    Ok([Op::INPUTS, &more].concat())
}

/// The declared characteristic of input or output `index` of `Op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    Required,
    Optional,
    Variadic,
}

impl Presence {
    /// Input `index`'s, for `index` below the declared count.
    pub fn of_input<Op: NeedleOp>(index: usize) -> Presence {
        match index.checked_sub(Op::INPUTS.len()) {
            None => Presence::Required,
            Some(_) if Op::VARIADIC.is_some() => Presence::Variadic,
            Some(_) => Presence::Optional,
        }
    }

    /// Output `index`'s, for `index` below the declared count.
    pub fn of_output<Op: NeedleOp>(index: usize) -> Presence {
        match index < Op::OUTPUTS {
            true => Presence::Required,
            false => Presence::Optional,
        }
    }
}

/// The element types of the declared inputs, in order: one for the variadic ones.
pub fn declared_inputs<Op: NeedleOp>() -> impl Iterator<Item = ElementType> {
    Op::INPUTS
        .iter()
        .chain(Op::OPTIONAL_INPUTS)
        .copied()
        .chain(Op::VARIADIC)
}

/// What takes the domain's ops one by one: a host's domain being built.
pub trait Registry {
    type Error;
    fn add<Op: NeedleOp>(&mut self) -> Result<(), Self::Error>;
}

/// Hands every op of the domain to `registry`.
pub fn register_all<R: Registry>(registry: &mut R) -> Result<(), R::Error> {
    registry.add::<Attention>()?;
    registry.add::<AttentionGate>()?;
    registry.add::<AttentionOut>()?;
    registry.add::<QkvHeads>()?;
    registry.add::<ConvState>()?;
    registry.add::<CqGather>()?;
    registry.add::<CqMatMul>()?;
    registry.add::<EngramGate>()?;
    registry.add::<EngramRows>()?;
    registry.add::<EngramValue>()?;
    registry.add::<HadamardMlp>()?;
    registry.add::<HyperConnectionsIn>()?;
    registry.add::<HyperConnectionsOut>()?;
    registry.add::<MonarchMlp>()?;
    registry.add::<ProbePool>()?;
    registry.add::<JointProbePool>()?;
    registry.add::<ResidualNorm>()?;
    registry.add::<Sinkhorn>()
}

/// `Op`'s error: `needle.<op>: <what>`.
pub fn op_error<Op: NeedleOp>(what: impl std::fmt::Display) -> OpError {
    OpError(format!("{DOMAIN}.{}: {what}", Op::NAME))
}

/// A non-negative integer attribute of `Op`, or the error that names it.
fn size_attribute<Op: NeedleOp>(
    attribute: &dyn Fn(&str) -> Option<i64>,
    name: &str,
) -> Result<usize, OpError> {
    attribute(name)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| op_error::<Op>(format!("no attribute {name}")))
}

/// What the ops' unit tests build their inputs from.
#[cfg(test)]
pub(crate) mod test_inputs {
    use super::{Input, InputData};

    /// A float32 input.
    pub fn float<'a>(shape: &'a [i64], data: &'a [f32]) -> Input<'a> {
        Input {
            shape,
            data: InputData::Float32(data),
        }
    }

    /// A 4 × 16 CQ matrix of 2-bit codes in one group of 16 (norms 1, ½, 2, ¾).
    pub struct SmallMatrix {
        codes: Vec<u8>,
        norms: [u16; 4],
        codebook: [f32; 4],
    }

    impl SmallMatrix {
        pub fn new() -> SmallMatrix {
            SmallMatrix {
                codes: (0..16).map(|i| (i * 37 % 256) as u8).collect(),
                norms: [0x3c00, 0x3800, 0x4000, 0x3a00],
                codebook: [-1.5, -0.5, 0.5, 1.5],
            }
        }

        /// Its `cols`, `group` and `bits` attributes.
        pub fn attribute(name: &str) -> Option<i64> {
            match name {
                "cols" | "group" => Some(16),
                "bits" => Some(2),
                _ => None,
            }
        }

        /// The codes, norms and codebook inputs.
        pub fn inputs(&self) -> [Input<'_>; 3] {
            [
                Input {
                    shape: &[4, 4],
                    data: InputData::Uint8(&self.codes),
                },
                Input {
                    shape: &[4, 1],
                    data: InputData::Float16(&self.norms),
                },
                float(&[4], &self.codebook),
            ]
        }
    }

    /// `len` small values of both signs, `scale` apart.
    pub fn values(len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 13 % 17) as f32 - 8.0) * scale)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Optional inputs may be left out at the end only; variadic ones need at least one.
    #[test]
    fn input_types_take_the_declared_counts() {
        let qkv = |count| input_types::<QkvHeads>(count).map(|t| t.len());
        assert_eq!(qkv(8), Ok(8));
        assert_eq!(qkv(9), Ok(9));
        assert_eq!(input_types::<QkvHeads>(9).unwrap()[8], ElementType::Int64);
        for count in [7, 10] {
            assert_eq!(
                qkv(count),
                Err(OpError(format!(
                    "needle.QkvHeads: {count} inputs is not a count it takes"
                )))
            );
        }
        let pool = |count| input_types::<ProbePool>(count).map(|t| t.len());
        assert!(pool(6).is_err());
        assert_eq!(pool(27), Ok(27));
        assert_eq!(
            input_types::<ProbePool>(27).unwrap()[26],
            ElementType::Float32
        );
        assert_eq!(Presence::of_input::<ProbePool>(5), Presence::Required);
        assert_eq!(Presence::of_input::<ProbePool>(6), Presence::Variadic);
        assert_eq!(Presence::of_output::<ProbePool>(1), Presence::Optional);
        assert_eq!(Presence::of_input::<QkvHeads>(8), Presence::Optional);
        assert_eq!(Presence::of_output::<QkvHeads>(1), Presence::Optional);
    }
}
