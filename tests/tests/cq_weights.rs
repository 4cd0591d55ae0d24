//! `cq` weight storage (`needle-export --weights cq`): the `.cact`'s codes in the graph,
//! decoded by ops onnxruntime folds at session creation. It must be the exact model: the
//! upstream cases within the contract's bound, and the float export's logits to 1e-6,
//! on every fixture (Needle 3's n3q carries CQ1, CQ2, CQ3, CQ4 and ternary matrices).

use graphs::contract::{AttentionKind, MatMulWeights, Precision};
use needle_tests::{
    case_logits, case_row_errors, cases, fixture, options, session_of, MODELS, TOLERANCE,
};
use runner::provider::Provider;

#[test]
fn cq_weights_are_the_exact_model_on_every_fixture() {
    let mut report = Vec::new();
    for model in MODELS {
        let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
        for kind in [AttentionKind::FUSED, AttentionKind::Reference] {
            let session = |weights| {
                session_of(
                    &bytes,
                    &options(kind, Precision::Fp32, weights),
                    Provider::Cpu,
                )
            };
            let (mut float, mut cq) = (session(MatMulWeights::Float), session(MatMulWeights::Cq));
            let vocab = cq.config().output_vocab();
            for case in cases(model) {
                let (want, got) = (case_logits(&mut float, &case), case_logits(&mut cq, &case));
                let upstream = case_row_errors(&got, &case.logits, &case, vocab);
                let exported = case_row_errors(&got, &want, &case, vocab);
                for (b, (upstream, float)) in upstream.into_iter().zip(exported).enumerate() {
                    report.push(format!(
                        "{model} {kind:?} {}[{b}]: upstream {upstream:.2e}, float export {float:.2e}",
                        case.name
                    ));
                    assert!(
                        upstream <= TOLERANCE,
                        "{model} {kind:?} {}[{b}]: {upstream}",
                        case.name
                    );
                    assert!(float == 0.0, "{model} {kind:?} {}[{b}]: {float}", case.name);
                }
            }
        }
    }
    println!("{}", report.join("\n"));
}
