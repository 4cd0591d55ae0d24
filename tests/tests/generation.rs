//! Greedy KV-cached generation reproduces upstream token for token (`<model>.generate.json`:
//! prompt ids with BOS, 32 new tokens or EOS; Needle 2's from `batch_generate`, Needle 3's
//! from `run.generate`, a full recompute per token).

use graphs::contract::AttentionKind::{self, Reference};
use needle_tests::{fixture_generate_options, generations, session, GENERATING_MODELS};
use runner::generate::generate;

const FUSED: AttentionKind = AttentionKind::FUSED;

#[test]
fn greedy_generation_matches_upstream_for_every_prompt() {
    for model in GENERATING_MODELS {
        for kind in [FUSED, Reference] {
            let mut s = session(model, kind);
            for r in generations(model) {
                let got = generate(&mut s, &r.prompt_ids, &fixture_generate_options()).unwrap();
                assert_eq!(got.generated_ids, r.generated_ids, "{model} {kind:?}");
                assert_eq!(
                    got.stopped_on.is_some(),
                    r.stopped_on_eos,
                    "{model} {kind:?}"
                );
            }
        }
    }
}
