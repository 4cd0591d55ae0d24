//! The node list of one layer of each variant, as an insta snapshot
//! (`tests/tests/snapshots/`): any change to what a layer emits — an op, a name, a wire —
//! shows up in review. Layer 0 of m48 is an engram site, so the snapshot has the
//! hyper-connections, the engram gate, attention and the Hadamard MLP.
//! After an intended change: `cargo insta review` (or `INSTA_UPDATE=always cargo test`).

use exporter::export::ExportOptions;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget};
use graphs::onnx::ModelProto;
use needle_tests::{onnx_of, options, read_fixture};
use prost::Message;

const LAYER: &str = "/model/layers.0/";

/// `op name(inputs) -> outputs`, one node a line, names relative to the layer's scope and
/// a node's first output written as the node itself.
fn layer_listing(opts: &ExportOptions) -> String {
    let model = ModelProto::decode(onnx_of(&read_fixture("m48.cact"), opts).as_slice()).unwrap();
    let short = |name: &str| {
        let name = name.strip_prefix(LAYER).unwrap_or(name);
        name.strip_suffix("/output_0").unwrap_or(name).to_string()
    };
    let mut out = String::new();
    for n in model.graph.unwrap().node {
        if !n.name.starts_with(LAYER) {
            continue;
        }
        let ins: Vec<String> = n.input.iter().map(|i| short(i)).collect();
        let outs: Vec<String> = n.output.iter().map(|o| short(o)).collect();
        out.push_str(&format!(
            "{} {}({}) -> {}\n",
            n.op_type,
            short(&n.name),
            ins.join(", "),
            outs.join(", ")
        ));
    }
    out
}

fn default_options(attention: AttentionKind) -> ExportOptions {
    options(attention, Precision::Fp32, MatMulWeights::Float)
}

#[test]
fn fused_layer_nodes() {
    insta::assert_snapshot!(layer_listing(&default_options(AttentionKind::FUSED)));
}

#[test]
fn fused_for_onnxruntime_1_20_layer_nodes() {
    let mut opts = default_options(AttentionKind::FUSED);
    opts.variant.runtime = RuntimeTarget::From1_20To1_23;
    insta::assert_snapshot!(layer_listing(&opts));
}

#[test]
fn reference_layer_nodes() {
    insta::assert_snapshot!(layer_listing(&default_options(AttentionKind::Reference)));
}
