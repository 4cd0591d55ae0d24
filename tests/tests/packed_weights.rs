//! `packed` weight storage (`needle-export --weights packed`): the `.cact`'s codes
//! multiplied as codes by `needle.CqMatMul`. It must be the exact model: the upstream
//! cases within the contract's bound and the float export's logits within 1e-5 relative
//! (the same weights summed in another order) on every fixture (Needle 3's n3q carries
//! CQ1, CQ2, CQ3, CQ4 and ternary), both attention variants, in batches of unequal rows.
//! Its greedy generations are checked in generation.rs.

use graphs::contract::{AttentionKind, MatMulWeights, Precision};
use needle_tests::{
    case_logits, case_row_errors, cases, fixture, options, row_error, session_of, MODELS, TOLERANCE,
};
use runner::provider::Provider;
use runner::session::NeedleSession;

const KINDS: [AttentionKind; 2] = [AttentionKind::FUSED, AttentionKind::Reference];

fn session(model: &str, kind: AttentionKind, weights: MatMulWeights) -> NeedleSession {
    let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
    session_of(
        &bytes,
        &options(kind, Precision::Fp32, weights),
        Provider::Cpu,
    )
}

#[test]
fn packed_weights_are_the_exact_model_on_every_fixture() {
    let mut report = Vec::new();
    for model in MODELS {
        for kind in KINDS {
            let mut float = session(model, kind, MatMulWeights::Float);
            let mut packed = session(model, kind, MatMulWeights::Packed);
            let vocab = packed.config().output_vocab();
            for case in cases(model) {
                let want = case_logits(&mut float, &case);
                let got = case_logits(&mut packed, &case);
                let upstream = case_row_errors(&got, &case.logits, &case, vocab);
                let exported = case_row_errors(&got, &want, &case, vocab);
                for (b, (upstream, float)) in upstream.into_iter().zip(exported).enumerate() {
                    let row = format!("{model} {kind:?} {}[{b}]", case.name);
                    report.push(format!(
                        "{row}: upstream {upstream:.2e}, float export {float:.2e}"
                    ));
                    assert!(upstream <= TOLERANCE, "{row}: upstream {upstream}");
                    assert!(float <= 1e-5, "{row}: float export {float}");
                }
            }
        }
    }
    println!("{}", report.join("\n"));
}

/// `logits_to_keep` (an optional input of the packed graphs, 0 unless fed): the call's
/// last `k` positions' logits, those of the call that keeps every one (within the bound:
/// fewer tokens may take the output head's one-token path), and every position's where
/// `k` asks for more than the call has. Both generations, both attention variants.
#[test]
fn logits_to_keep_gives_the_last_positions_logits() {
    for model in ["m64", "needle3/n3a"] {
        for kind in KINDS {
            let mut packed = session(model, kind, MatMulWeights::Packed);
            let vocab = packed.config().output_vocab();
            let ids: Vec<i64> = (0..9).map(|i| 4 + (i * 37) % 200).collect();
            let every = packed.forward(&ids, 1, packed.empty_cache(1).unwrap());
            let every = every.unwrap().logits;
            assert_eq!(
                every.len(),
                ids.len() * vocab,
                "{model} {kind:?}: every position"
            );
            for keep in [1, 3, ids.len(), ids.len() + 5] {
                let cache = packed.empty_cache(1).unwrap();
                let got = packed.forward_keeping(&ids, 1, cache, keep).unwrap().logits;
                let kept = keep.min(ids.len());
                let what = format!("{model} {kind:?} logits_to_keep {keep}");
                assert_eq!(got.len(), kept * vocab, "{what}: positions");
                let want = &every[(ids.len() - kept) * vocab..];
                let err = row_error(&got, want, kept, vocab);
                assert!(err <= 1e-5, "{what}: {err:.2e}");
            }
        }
    }
}
