//! A small ONNX graph builder: scoped unique node names
//! (`/model/layers.0/self_attn/MatMul`), outputs `{node}/output_{i}`, constants
//! shared by value, initializers as little-endian `raw_data`.

use crate::contract::Precision;
use crate::onnx::{
    attribute_type, data_type, AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TensorShapeProto,
    TensorTypeProto, TypeProto, ValueInfoProto,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Display;
use std::rc::Rc;

/// The ai.onnx opset a graph is written against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Opset {
    /// Opset 21 (IR 10, ONNX 1.16): the widest runtime and execution-provider support.
    V21,
    /// Opset 23 (IR 11, ONNX 1.18): adds `RMSNormalization` and `RotaryEmbedding` as kernels.
    V23,
}

impl Opset {
    fn version(self) -> i64 {
        match self {
            Opset::V21 => 21,
            Opset::V23 => 23,
        }
    }

    fn ir_version(self) -> i64 {
        match self {
            Opset::V21 => 10,
            Opset::V23 => 11,
        }
    }
}
/// The onnxruntime contrib-op domain.
pub const MS_DOMAIN: &str = "com.microsoft";

/// A tensor name in the graph, nothing more.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Value(Rc<str>);

impl Value {
    /// An optional input left out: ONNX's empty name.
    pub fn absent() -> Value {
        Value(Rc::from(""))
    }

    /// The tensor's name in the graph.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// One operator attribute value.
#[derive(Clone, Debug)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Ints(Vec<i64>),
    Str(&'static str),
}

/// Attributes of one node, by name.
pub type Attrs = Vec<(&'static str, Attr)>;

impl Precision {
    /// The ONNX `TensorProto.DataType` of this precision.
    pub fn data_type(self) -> i32 {
        match self {
            Precision::Fp32 => data_type::FLOAT,
            Precision::Fp16 => data_type::FLOAT16,
        }
    }

    /// Little-endian bytes of `values` in this precision. (Filled into a buffer of the
    /// final size: collecting a `flat_map` grows the buffer by doubling, which copied and
    /// faulted in ~2× a full-size model's weights.)
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let width = match self {
            Precision::Fp32 => 4,
            Precision::Fp16 => 2,
        };
        let mut bytes = vec![0; values.len() * width];
        // Fixed-size pieces copied in place: `extend_from_slice` a value at a time checked
        // the capacity every time and was 7% of a full-size export's samples.
        match self {
            Precision::Fp32 => bytes
                .chunks_exact_mut(4)
                .zip(values)
                .for_each(|(b, v)| b.copy_from_slice(&v.to_le_bytes())),
            Precision::Fp16 => bytes
                .chunks_exact_mut(2)
                .zip(values)
                .for_each(|(b, v)| b.copy_from_slice(&f32_to_f16(*v).to_le_bytes())),
        }
        bytes
    }
}

/// A dimension of a graph input or output.
#[derive(Clone, Debug)]
pub enum Dim {
    Fixed(usize),
    Named(&'static str),
}

/// Builds one ONNX graph. Builder calls cannot fail: a duplicate name is a bug and panics.
pub struct GraphBuilder {
    opset: Opset,
    precision: Precision,
    scopes: Vec<String>,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    initializer_names: HashSet<String>,
    node_name_uses: HashMap<String, usize>,
    constants: HashMap<(i32, Vec<i64>, Vec<u8>), Value>,
    domains: BTreeMap<String, i64>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    value_infos: Vec<ValueInfoProto>,
}

impl GraphBuilder {
    /// An empty `opset` graph whose float weights and constants are stored in `precision`.
    pub fn new(opset: Opset, precision: Precision) -> Self {
        let mut domains = BTreeMap::new();
        domains.insert(String::new(), opset.version());
        GraphBuilder {
            opset,
            precision,
            scopes: Vec::new(),
            nodes: Vec::new(),
            initializers: Vec::new(),
            initializer_names: HashSet::new(),
            node_name_uses: HashMap::new(),
            constants: HashMap::new(),
            domains,
            inputs: Vec::new(),
            outputs: Vec::new(),
            value_infos: Vec::new(),
        }
    }

    /// The float precision of this graph.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Runs `f` with `segment` appended to the scope path (node names and weight names).
    pub fn scope<R>(&mut self, segment: impl Display, f: impl FnOnce(&mut Self) -> R) -> R {
        self.scopes.push(segment.to_string());
        let out = f(self);
        self.scopes.pop();
        out
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem_type: i32, dims: &[Dim]) -> Value {
        self.inputs.push(value_info(name, elem_type, dims));
        Value(Rc::from(name))
    }

    /// Declares an optional graph input: an initializer of the same name holds its value
    /// where a caller feeds none (ONNX IR ≥ 4: an overridable initializer).
    pub fn input_with_default(
        &mut self,
        name: &str,
        elem_type: i32,
        dims: &[usize],
        default: Vec<u8>,
    ) -> Value {
        let named: Vec<Dim> = dims.iter().map(|&d| Dim::Fixed(d)).collect();
        self.inputs.push(value_info(name, elem_type, &named));
        self.initializer(name.to_string(), elem_type, dims, default)
    }

    /// Records the shape of an intermediate `value` in `value_info`. ONNX shape
    /// inference cannot add symbolic dimensions (`past_sequence + sequence`) and
    /// invents a fresh `unk__N` symbol wherever it meets one; naming the shape at
    /// those places keeps every later tensor on the contract's symbols, which
    /// onnxruntime's session creation needs (thousands of fresh symbols made it
    /// take seconds).
    pub fn declare(&mut self, value: &Value, elem_type: i32, dims: &[Dim]) {
        self.value_infos
            .push(value_info(value.name(), elem_type, dims));
    }

    /// Declares `value` as the graph output `name` (through an Identity node).
    pub fn output(&mut self, value: &Value, name: &str, elem_type: i32, dims: &[Dim]) {
        self.push_node("Identity", "", &[value], Vec::new(), vec![name.to_string()]);
        self.outputs.push(value_info(name, elem_type, dims));
    }

    /// A float initializer named `<scope path>.<local>`, stored in the graph's precision.
    pub fn weight(&mut self, local: &str, shape: &[usize], data: &[f32]) -> Value {
        let raw = self.precision.encode(data);
        self.weight_bytes(local, self.precision.data_type(), shape, raw)
    }

    /// An initializer of any type from raw little-endian bytes, named like [`Self::weight`].
    pub fn weight_bytes(
        &mut self,
        local: &str,
        dtype: i32,
        shape: &[usize],
        raw: Vec<u8>,
    ) -> Value {
        let mut path = self.scopes.join(".");
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(local);
        self.initializer(path, dtype, shape, raw)
    }

    fn initializer(&mut self, name: String, dtype: i32, shape: &[usize], raw: Vec<u8>) -> Value {
        assert!(
            self.initializer_names.insert(name.clone()),
            "duplicate initializer {name}"
        );
        self.initializers.push(TensorProto {
            dims: shape.iter().map(|&d| d as i64).collect(),
            data_type: dtype,
            name: name.clone(),
            raw_data: raw,
            ..Default::default()
        });
        Value(Rc::from(name.as_str()))
    }

    fn constant(&mut self, dtype: i32, dims: Vec<i64>, raw: Vec<u8>) -> Value {
        let key = (dtype, dims, raw);
        if let Some(v) = self.constants.get(&key) {
            return v.clone();
        }
        let name = format!("/model/constants/c{}", self.constants.len());
        let shape: Vec<usize> = key.1.iter().map(|&d| d as usize).collect();
        let v = self.initializer(name, dtype, &shape, key.2.clone());
        self.constants.insert(key, v.clone());
        v
    }

    /// A constant of any type from raw little-endian bytes, shared by value.
    pub fn const_bytes(&mut self, dtype: i32, shape: &[usize], raw: Vec<u8>) -> Value {
        let dims = shape.iter().map(|&d| d as i64).collect();
        self.constant(dtype, dims, raw)
    }

    /// A 1-D int64 constant, shared by value.
    pub fn const_i64(&mut self, values: &[i64]) -> Value {
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(data_type::INT64, vec![values.len() as i64], raw)
    }

    /// A scalar int64 constant, shared by value.
    pub fn scalar_i64(&mut self, value: i64) -> Value {
        self.constant(data_type::INT64, vec![], value.to_le_bytes().to_vec())
    }

    /// A float constant of any shape in the graph's precision, shared by value.
    pub fn const_float(&mut self, shape: &[usize], values: &[f32]) -> Value {
        let raw = self.precision.encode(values);
        let dims = shape.iter().map(|&d| d as i64).collect();
        self.constant(self.precision.data_type(), dims, raw)
    }

    /// A float scalar constant in the graph's precision.
    pub fn scalar_float(&mut self, value: f32) -> Value {
        self.const_float(&[], &[value])
    }

    /// Emits one ai.onnx node with `n_out` outputs.
    pub fn op(&mut self, ty: &str, ins: &[&Value], attrs: Attrs, n_out: usize) -> Vec<Value> {
        self.op_in("", ty, ins, attrs, n_out)
    }

    /// Emits one node of `domain` (recorded in `opset_import`) with `n_out` outputs.
    pub fn op_in(
        &mut self,
        domain: &str,
        ty: &str,
        ins: &[&Value],
        attrs: Attrs,
        n_out: usize,
    ) -> Vec<Value> {
        if !domain.is_empty() {
            self.domains.entry(domain.to_string()).or_insert(1);
        }
        let name = self.node_name(ty);
        let outs: Vec<String> = (0..n_out).map(|i| format!("{name}/output_{i}")).collect();
        let attrs = attrs.into_iter().map(|(n, a)| attribute(n, a)).collect();
        self.push_named_node(name, ty, domain, ins, attrs, outs.clone());
        outs.into_iter()
            .map(|o| Value(Rc::from(o.as_str())))
            .collect()
    }

    /// Emits one single-output ai.onnx node.
    pub fn op1(&mut self, ty: &str, ins: &[&Value], attrs: Attrs) -> Value {
        self.op(ty, ins, attrs, 1).remove(0)
    }

    fn node_name(&mut self, ty: &str) -> String {
        let mut base = String::from("/model");
        for s in &self.scopes {
            base.push('/');
            base.push_str(s);
        }
        base.push('/');
        base.push_str(ty);
        let uses = self.node_name_uses.entry(base.clone()).or_insert(0);
        let name = if *uses == 0 {
            base
        } else {
            format!("{base}_{uses}")
        };
        *uses += 1;
        name
    }

    fn push_node(
        &mut self,
        ty: &str,
        domain: &str,
        ins: &[&Value],
        attrs: Vec<AttributeProto>,
        outs: Vec<String>,
    ) {
        let name = self.node_name(ty);
        self.push_named_node(name, ty, domain, ins, attrs, outs);
    }

    fn push_named_node(
        &mut self,
        name: String,
        ty: &str,
        domain: &str,
        ins: &[&Value],
        attribute: Vec<AttributeProto>,
        output: Vec<String>,
    ) {
        self.nodes.push(NodeProto {
            input: ins.iter().map(|v| v.name().to_string()).collect(),
            output,
            name,
            op_type: ty.to_string(),
            attribute,
            domain: domain.to_string(),
        });
    }

    /// Finishes the graph into a model with the given documentation and metadata.
    pub fn finish(
        self,
        graph_name: &str,
        doc_string: String,
        metadata: Vec<(String, String)>,
    ) -> ModelProto {
        ModelProto {
            ir_version: self.opset.ir_version(),
            producer_name: "needle-onnx".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            domain: String::new(),
            model_version: 1,
            doc_string,
            graph: Some(GraphProto {
                node: self.nodes,
                name: graph_name.into(),
                initializer: self.initializers,
                doc_string: String::new(),
                input: self.inputs,
                output: self.outputs,
                value_info: self.value_infos,
            }),
            opset_import: self
                .domains
                .into_iter()
                .map(|(domain, version)| OperatorSetIdProto { domain, version })
                .collect(),
            metadata_props: metadata
                .into_iter()
                .map(|(key, value)| StringStringEntryProto { key, value })
                .collect(),
        }
    }
}

fn attribute(name: &str, a: Attr) -> AttributeProto {
    let mut p = AttributeProto {
        name: name.to_string(),
        ..Default::default()
    };
    match a {
        Attr::Int(i) => (p.i, p.r#type) = (i, attribute_type::INT),
        Attr::Float(f) => (p.f, p.r#type) = (f, attribute_type::FLOAT),
        Attr::Ints(v) => (p.ints, p.r#type) = (v, attribute_type::INTS),
        Attr::Str(v) => (p.s, p.r#type) = (v.as_bytes().to_vec(), attribute_type::STRING),
    }
    p
}

fn value_info(name: &str, elem_type: i32, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => DimensionValue::DimValue(*n as i64),
                Dim::Named(s) => DimensionValue::DimParam(s.to_string()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type,
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
        doc_string: String::new(),
    }
}

/// IEEE binary16 bits of `x`, rounded to nearest even (overflow to infinity).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

#[cfg(test)]
mod tests {
    use super::f32_to_f16;

    #[test]
    fn f16_rounding_matches_ieee() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(70000.0), 0x7c00);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
    }
}
