//! `--layers N` of a Needle 3 file against upstream's sub-network of the same file:
//! `n3a_d4.cases.safetensors` holds `apply(..., exit_depth=4)` and the heads with
//! `exit_depth=4` on `n3a.cact`'s weights (`X.parent_exit_logits`, `H.parent_exit_*`).

use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use graphs::contract::AttentionKind::{self, Reference};
use graphs::contract::{MatMulWeights, Precision};
use needle_tests::{fixture, options, row_error, TOLERANCE};
use runner::provider::Provider;
use runner::session::{NeedleSession, StepInputs};
use safetensors::SafeTensors;

const FUSED: AttentionKind = AttentionKind::FUSED;

fn rung_session(kind: AttentionKind) -> NeedleSession {
    let bytes = std::fs::read(fixture("needle3/n3a.cact")).unwrap();
    let model = NeedleModel::from_bytes("n3a.cact", &bytes)
        .unwrap()
        .rung(4)
        .unwrap();
    let opts: ExportOptions = options(kind, Precision::Fp32, MatMulWeights::Float);
    NeedleSession::create(&model.export(&opts), Provider::Cpu, false, 1).unwrap()
}

fn values<T>(st: &SafeTensors, name: &str, width: usize, read: fn(&[u8]) -> T) -> Vec<T> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    t.data().chunks(width).map(read).collect()
}

#[test]
fn a_rung_of_the_file_is_upstreams_sub_network_of_it() {
    let bytes = std::fs::read(fixture("needle3/n3a_d4.cases.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let i64s = |b: &[u8]| i64::from_le_bytes(b.try_into().unwrap());
    let f32s = |b: &[u8]| f32::from_le_bytes(b.try_into().unwrap());
    let mut report = Vec::new();
    for kind in [FUSED, Reference] {
        let mut s = rung_session(kind);
        assert_eq!(s.config().num_layers(), 4);
        let vocab = s.config().output_vocab();
        let mut cases: Vec<&str> = st
            .names()
            .into_iter()
            .filter_map(|n| n.strip_suffix(".parent_exit_logits"))
            .collect();
        cases.sort_unstable();
        assert!(!cases.is_empty(), "no parent_exit_logits cases");
        for case in cases {
            let ids = values(&st, &format!("{case}.input_ids"), 8, i64s);
            let lengths = values(&st, &format!("{case}.lengths"), 8, i64s);
            let want = values(&st, &format!("{case}.parent_exit_logits"), 4, f32s);
            let batch = lengths.len();
            let seq = ids.len() / batch;
            let cache = s.empty_cache(batch).unwrap();
            let got = s.forward(&ids, batch, cache).unwrap().logits;
            for (b, &length) in lengths.iter().enumerate() {
                let rows = b * seq * vocab..(b + 1) * seq * vocab;
                let err = row_error(&got[rows.clone()], &want[rows], length as usize, vocab);
                report.push(format!("{kind:?} {case}[{b}]: {err:.2e}"));
                assert!(err <= TOLERANCE, "{kind:?} {case} row {b}: {err}");
            }
        }
        let ids = values(&st, "H.input_ids", 8, i64s);
        let lengths = values(&st, "H.lengths", 8, i64s);
        let want = values(&st, "H.parent_exit_confidence", 4, f32s);
        let batch = lengths.len();
        let seq = ids.len() / batch;
        let inputs = StepInputs {
            input_ids: ids,
            attention_mask: lengths
                .iter()
                .flat_map(|&n| (0..seq as i64).map(move |t| i64::from(t < n)))
                .collect(),
            position_ids: (0..batch).flat_map(|_| 0..seq as i64).collect(),
            batch,
            heads: true,
            logits_to_keep: 0,
        };
        let cache = s.empty_cache(batch).unwrap();
        let got = s.step(inputs, cache).unwrap().confidence_logit.unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{kind:?}: {g} vs {w}"
            );
        }
    }
    println!("{}", report.join("\n"));
}
