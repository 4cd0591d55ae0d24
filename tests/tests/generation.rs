//! Greedy KV-cached generation reproduces upstream token for token (`<model>.generate.json`:
//! prompt ids with BOS, 32 new tokens or EOS; Needle 2's from `batch_generate`, Needle 3's
//! from `run.generate`, a full recompute per token), with float and with packed weights
//! (the Needle kernels multiplying the `.cact`'s codes).

use graphs::contract::AttentionKind::{self, Reference};
use graphs::contract::{MatMulWeights, Precision};
use needle_tests::{
    fixture, fixture_generate_options, generations, options, session_of, GENERATING_MODELS,
};
use runner::generate::generate;
use runner::provider::Provider;

const FUSED: AttentionKind = AttentionKind::FUSED;

#[test]
fn greedy_generation_matches_upstream_for_every_prompt() {
    for model in GENERATING_MODELS {
        let bytes = std::fs::read(fixture(&format!("{model}.cact"))).unwrap();
        for kind in [FUSED, Reference] {
            for weights in [MatMulWeights::Float, MatMulWeights::Packed] {
                let opts = options(kind, Precision::Fp32, weights);
                let mut s = session_of(&bytes, &opts, Provider::Cpu);
                for r in generations(model) {
                    let got = generate(&mut s, &r.prompt_ids, &fixture_generate_options()).unwrap();
                    let what = format!("{model} {kind:?} {weights}");
                    assert_eq!(got.generated_ids, r.generated_ids, "{what}");
                    assert_eq!(got.stopped_on.is_some(), r.stopped_on_eos, "{what}");
                }
            }
        }
    }
}
