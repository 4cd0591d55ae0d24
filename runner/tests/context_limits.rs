//! The end of the context: generation stops where upstream's KV-cached decode stops at
//! `max_seq_len`, and calls onnxruntime would refuse with a misleading message (one call
//! longer than the context, which RotaryEmbedding words as "Updating cos_cache and
//! sin_cache … is not currently supported") get the runner's own one-line error first.

use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant};
use runner::provider::Provider;
use runner::session::{NeedleSession, StepInputs};
use serde_json::Value;
use std::process::Command;
use test_support::fixture;

const VARIANTS: [AttentionKind; 2] = [AttentionKind::FUSED, AttentionKind::Reference];

fn session(kind: AttentionKind) -> NeedleSession {
    let model = NeedleModel::read(&fixture("m64.cact")).unwrap();
    let variant = Variant {
        attention: kind,
        precision: Precision::Fp32,
        matmul_weights: MatMulWeights::Float,
        runtime: RuntimeTarget::Since1_24,
    };
    let onnx = model.export(&ExportOptions::in_memory(variant));
    NeedleSession::create(&onnx, Provider::Cpu, false, 1).unwrap()
}

/// `tests/fixtures/m64.context_end.json` (`make_context_end_fixture.py`): upstream
/// `generate_cached` asked for far more tokens than m64's 256 positions hold.
#[test]
fn generation_stops_where_upstream_stops_at_max_seq_len() {
    let text = std::fs::read_to_string(fixture("m64.context_end.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let prompt = reference["prompt"].as_str().unwrap();
    let max_new = reference["max_new_tokens"].to_string();
    for attention in ["fused", "reference"] {
        let o = Command::new(env!("CARGO_BIN_EXE_needle-run"))
            .arg("--model")
            .arg(fixture("m64.cact"))
            .args(["--provider", "cpu", "--attention", attention])
            .args(["--raw", prompt, "--json", "--max-new-tokens", &max_new])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let ours: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(ours["prompt_ids"], reference["prompt_ids"]);
        let (ours, theirs) = (&ours["generated_ids"], &reference["generated_ids"]);
        let len = |v: &Value| v.as_array().unwrap().len();
        assert_eq!(len(ours), len(theirs), "{attention}: token count");
        assert_eq!(ours, theirs, "{attention}");
    }
}

#[test]
fn a_call_longer_than_the_context_is_our_error_not_onnxruntimes() {
    for kind in VARIANTS {
        let mut s = session(kind);
        let max = s.config().max_seq_len();
        let seq = max + 1;
        let inputs = StepInputs {
            input_ids: vec![5; seq],
            attention_mask: vec![1; seq],
            position_ids: vec![0; seq],
            batch: 1,
            heads: false,
            logits_to_keep: 0,
        };
        let cache = s.empty_cache(1).unwrap();
        let err = format!("{:#}", s.step(inputs, cache).err().unwrap());
        assert!(err.contains("max_seq_len 256"), "{kind}: {err}");
        assert!(
            err.contains(&format!("{seq} in this call")),
            "{kind}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{kind}: {err}");
    }
}

#[test]
fn a_row_of_padding_only_runs_in_every_cache_layout() {
    for kind in VARIANTS {
        let mut s = session(kind);
        for cache in [
            s.empty_cache(1).unwrap(),
            s.preallocated_cache(1, 8).unwrap(),
        ] {
            let inputs = StepInputs {
                input_ids: vec![5; 3],
                attention_mask: vec![0; 3],
                position_ids: vec![0; 3],
                batch: 1,
                heads: false,
                logits_to_keep: 0,
            };
            let out = s.step(inputs, cache);
            let out = out.map_err(|e| format!("{kind}: {e:#}")).unwrap();
            assert!(out.logits.iter().all(|l| l.is_finite()), "{kind}");
        }
    }
}
