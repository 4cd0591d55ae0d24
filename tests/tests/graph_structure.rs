//! Structural checks of the exported graphs that onnxruntime would not report:
//! unique node names in `/model/<scope>/<Op>` form, topological order, every
//! initializer used, the contract's interface, and the domains per variant.

use exporter::cact::Needle2File;
use graphs::contract::AttentionKind;
use graphs::contract::{MatMulWeights, Precision, RuntimeTarget};
use graphs::onnx::{DimensionValue, ModelProto, ValueInfoProto};
use needle_tests::{fixture, onnx_of, options};
use prost::Message;
use std::collections::HashSet;

fn model(name: &str, attention: AttentionKind, matmul_weights: MatMulWeights) -> ModelProto {
    let bytes = std::fs::read(fixture(&format!("{name}.cact"))).unwrap();
    let opts = options(attention, Precision::Fp32, matmul_weights);
    ModelProto::decode(onnx_of(&bytes, &opts).as_slice()).unwrap()
}

fn dims(v: &ValueInfoProto) -> Vec<String> {
    let shape = v
        .r#type
        .as_ref()
        .unwrap()
        .tensor_type
        .as_ref()
        .unwrap()
        .shape
        .as_ref()
        .unwrap();
    shape
        .dim
        .iter()
        .map(|d| match d.value.as_ref().unwrap() {
            DimensionValue::DimValue(n) => n.to_string(),
            DimensionValue::DimParam(s) => s.clone(),
        })
        .collect()
}

#[test]
fn graphs_are_well_formed_and_follow_the_contract() {
    for attention in [AttentionKind::FUSED, AttentionKind::Reference] {
        for weights in [MatMulWeights::Float, MatMulWeights::Int4] {
            let m = model("m48", attention, weights);
            let g = m.graph.as_ref().unwrap();
            let mut names = HashSet::new();
            let mut available: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
            available.extend(g.initializer.iter().map(|t| t.name.as_str()));
            available.insert("");
            let mut used = HashSet::new();
            for n in &g.node {
                assert!(
                    names.insert(n.name.as_str()),
                    "duplicate node name {}",
                    n.name
                );
                assert!(
                    n.name.starts_with("/model/") && n.name.contains(&n.op_type),
                    "{}",
                    n.name
                );
                for i in &n.input {
                    assert!(
                        available.contains(i.as_str()),
                        "{} reads {i} before it exists",
                        n.name
                    );
                    used.insert(i.as_str());
                }
                available.extend(n.output.iter().map(String::as_str));
            }
            for t in &g.initializer {
                assert!(
                    used.contains(t.name.as_str()),
                    "initializer {} is unused",
                    t.name
                );
            }
            let inputs: Vec<(&str, Vec<String>)> =
                g.input.iter().map(|i| (i.name.as_str(), dims(i))).collect();
            assert_eq!(
                inputs[0],
                ("input_ids", vec!["batch".into(), "sequence".into()])
            );
            assert_eq!(
                inputs[1],
                (
                    "attention_mask",
                    vec!["batch".into(), "total_sequence".into()]
                )
            );
            assert!(inputs.contains(&("position_ids", vec!["batch".into(), "sequence".into()])));
            // m48 has 5 layers: pair 5 is the token history, shaped like the layers' pairs.
            let pair = |len: &str| vec!["batch".into(), "1".into(), len.into(), "32".into()];
            for name in ["past_key_values.5.key", "past_key_values.5.value"] {
                assert!(inputs.contains(&(name, pair("past_sequence"))), "{name}");
            }
            assert_eq!(
                inputs.len(),
                3 + 2 * 6,
                "ids, mask, positions and 6 cache pairs"
            );
            assert!(inputs.contains(&(
                "past_key_values.4.value",
                vec![
                    "batch".into(),
                    "1".into(),
                    "past_sequence".into(),
                    "32".into()
                ]
            )));
            let outputs: Vec<(&str, Vec<String>)> = g
                .output
                .iter()
                .map(|o| (o.name.as_str(), dims(o)))
                .collect();
            assert_eq!(
                outputs[0],
                (
                    "logits",
                    vec!["batch".into(), "sequence".into(), "512".into()]
                )
            );
            for name in ["present.5.key", "present.5.value"] {
                assert!(outputs.contains(&(name, pair("total_sequence"))), "{name}");
            }
            assert!(outputs.contains(&(
                "present.0.key",
                vec![
                    "batch".into(),
                    "1".into(),
                    "total_sequence".into(),
                    "32".into()
                ]
            )));
            let domains: HashSet<&str> = g.node.iter().map(|n| n.domain.as_str()).collect();
            let imported: HashSet<&str> =
                m.opset_import.iter().map(|o| o.domain.as_str()).collect();
            assert_eq!(
                domains, imported,
                "opset_import lists exactly the domains used"
            );
            let contrib = attention == AttentionKind::FUSED || weights != MatMulWeights::Float;
            assert_eq!(
                domains.contains("com.microsoft"),
                contrib,
                "{attention:?} {weights:?}"
            );
            let meta: HashSet<&str> = m.metadata_props.iter().map(|p| p.key.as_str()).collect();
            for key in [
                "needle.vocab_size",
                "needle.engram_sites",
                "needle.source_sha256",
                "needle.attention",
                "needle.eos_token_id",
            ] {
                assert!(meta.contains(key), "metadata {key} missing");
            }
            let padding = m
                .metadata_props
                .iter()
                .find(|p| p.key == "needle.padding_side");
            assert_eq!(padding.map(|p| p.value.as_str()), Some("right"));
        }
    }
}

/// onnxruntime's CUDA `RMSNormalization` reads as many scale values as the normalized axis
/// is wide whatever the scale's shape; a broadcast scalar scale gave garbage logits on an
/// H200 (0.64 relative error) while the CPU kernel broadcast it correctly.
#[test]
fn rms_normalization_scales_are_as_wide_as_their_axis() {
    let bytes = std::fs::read(fixture("m48.cact")).unwrap();
    let cfg = Needle2File::parse(&bytes).unwrap().config();
    // q/k norms span a head, the block norms d_model, the hyper-connections' all lanes.
    let c = &cfg.common;
    let widths = [cfg.head_dim, c.d_model, c.mhc_lanes * c.d_model].map(|w| w as i64);
    let m = model("m48", AttentionKind::FUSED, MatMulWeights::Float);
    let g = m.graph.as_ref().unwrap();
    let mut seen = 0;
    for n in g.node.iter().filter(|n| n.op_type == "RMSNormalization") {
        let scale = g
            .initializer
            .iter()
            .find(|t| t.name == n.input[1])
            .unwrap_or_else(|| panic!("{}: scale is not an initializer", n.name));
        assert!(
            scale.dims.len() == 1 && widths.contains(&scale.dims[0]),
            "{}: scale dims {:?}, want one of {widths:?}",
            n.name,
            scale.dims
        );
        seen += 1;
    }
    assert!(seen > 0, "the fused graph has no RMSNormalization");
}

/// The fused graph for onnxruntime 1.20–1.23 is what those releases load (IR 10, ai.onnx
/// opset 21: no `RMSNormalization`, RoPE as the contrib kernel) and gives its sliding
/// window as they count `local_window_size`, one less than 1.24 does; it says so.
#[test]
fn the_fused_graph_for_onnxruntime_1_20_is_ir_10_opset_21_with_their_window() {
    let bytes = std::fs::read(fixture("m64w.cact")).unwrap();
    let window = Needle2File::parse(&bytes)
        .unwrap()
        .config()
        .common
        .kv_window as i64;
    for (runtime, ir, opset, rope_domain, local_window) in [
        (RuntimeTarget::Since1_24, 11, 23, "", window),
        (
            RuntimeTarget::From1_20To1_23,
            10,
            21,
            "com.microsoft",
            window - 1,
        ),
    ] {
        let mut opts = options(AttentionKind::FUSED, Precision::Fp32, MatMulWeights::Float);
        opts.variant.runtime = runtime;
        let m = ModelProto::decode(onnx_of(&bytes, &opts).as_slice()).unwrap();
        assert_eq!(m.ir_version, ir, "{runtime}");
        let ai_onnx = m.opset_import.iter().find(|o| o.domain.is_empty()).unwrap();
        assert_eq!(ai_onnx.version, opset, "{runtime}");
        let g = m.graph.as_ref().unwrap();
        let of = |op: &'static str| g.node.iter().filter(move |n| n.op_type == op);
        let rope_domains: HashSet<&str> =
            of("RotaryEmbedding").map(|n| n.domain.as_str()).collect();
        assert_eq!(rope_domains, HashSet::from([rope_domain]), "{runtime}");
        assert_eq!(of("RMSNormalization").count() > 0, opset == 23, "{runtime}");
        let windows: HashSet<i64> = of("GroupQueryAttention")
            .flat_map(|n| &n.attribute)
            .filter(|a| a.name == "local_window_size")
            .map(|a| a.i)
            .collect();
        assert_eq!(windows, HashSet::from([local_window]), "{runtime}");
        let recorded = m
            .metadata_props
            .iter()
            .find(|p| p.key == "needle.onnxruntime");
        assert_eq!(recorded.map(|p| p.value.clone()), Some(runtime.to_string()));
    }
}
