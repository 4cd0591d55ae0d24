//! Greedy KV-cached generation reproduces upstream `batch_generate` token for token
//! (`<model>.generate.json`: prompt ids with BOS, 32 new tokens or EOS).

use graphs::needle::AttentionKind::{Fused, Reference};
use needle_tests::{fixture, session};
use runner::generate::{generate, GenerateOptions, Sampling};
use serde_json::Value;

#[test]
fn greedy_generation_matches_upstream_for_every_prompt() {
    for model in ["m48", "m64", "m96"] {
        let text = std::fs::read_to_string(fixture(&format!("{model}.generate.json"))).unwrap();
        let refs: Vec<Value> = serde_json::from_str(&text).unwrap();
        for kind in [Fused, Reference] {
            let mut s = session(model, kind);
            for r in &refs {
                let ids = |k: &str| -> Vec<u32> {
                    r[k].as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as u32)
                        .collect()
                };
                let opts = GenerateOptions {
                    max_new_tokens: 32,
                    stop_ids: vec![1],
                    sampling: Sampling::Greedy,
                };
                let got = generate(&mut s, &ids("prompt_ids"), &opts).unwrap();
                assert_eq!(got.generated_ids, ids("generated_ids"), "{model} {kind:?}");
                assert_eq!(
                    got.stopped_on.is_some(),
                    r["stopped_on_eos"].as_bool().unwrap(),
                    "{model} {kind:?}"
                );
            }
        }
    }
}
