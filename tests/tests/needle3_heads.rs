//! The Needle 3 confidence head (graph output `confidence_logit`) against upstream's
//! `forward_confidence` (`tests/fixtures/needle3/`): the padded batch of case `H` and each
//! generation's prompt + completion, both variants; and the packed graphs' pools carried
//! through a generation.

use graphs::contract::AttentionKind::{self, Reference};
use graphs::contract::MatMulWeights;
use needle_tests::{f32_values, fixture, i64_values, session, session_with};
use runner::decode::{GenerateOptions, Sampling};
use runner::generate::generate;
use runner::session::StepInputs;
use safetensors::SafeTensors;

const FUSED: AttentionKind = AttentionKind::FUSED;
/// Needle 3 fixtures; `n3c` has no heads and `n3q`/`n3a_d4` no generations.
const MODELS: [&str; 5] = [
    "needle3/n3a",
    "needle3/n3b",
    "needle3/n3c",
    "needle3/n3q",
    "needle3/n3a_d4",
];

fn sigmoid(x: f32) -> f64 {
    1.0 / (1.0 + (-f64::from(x)).exp())
}

#[test]
fn the_confidence_head_matches_upstream_on_padded_batches_and_generations() {
    let mut report = Vec::new();
    for model in MODELS {
        let bytes = std::fs::read(fixture(&format!("{model}.cases.safetensors"))).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let has_head = st.names().contains(&"H.confidence");
        for kind in [FUSED, Reference] {
            assert_eq!(
                session(model, kind).has_confidence_head(),
                has_head,
                "{model}"
            );
        }
        if !has_head {
            continue;
        }
        let ids = i64_values(&st, "H.input_ids");
        let lengths = i64_values(&st, "H.lengths");
        let want = f32_values(&st, "H.confidence");
        let batch = lengths.len();
        let seq = ids.len() / batch;
        let generations: Vec<serde_json::Value> =
            std::fs::read_to_string(fixture(&format!("{model}.generate.json")))
                .map(|text| serde_json::from_str(&text).unwrap())
                .unwrap_or_default();
        let weights = [MatMulWeights::Float, MatMulWeights::Packed];
        for (kind, weights) in [FUSED, Reference]
            .into_iter()
            .flat_map(|k| weights.map(|w| (k, w)))
        {
            let mut s = session_with(model, kind, weights);
            // Right padding: each row's real tokens first, mask 0 after.
            let mask: Vec<i64> = lengths
                .iter()
                .flat_map(|&n| (0..seq as i64).map(move |t| i64::from(t < n)))
                .collect();
            let positions: Vec<i64> = (0..batch).flat_map(|_| 0..seq as i64).collect();
            let inputs = StepInputs {
                input_ids: ids.clone(),
                attention_mask: mask,
                position_ids: positions,
                batch,
                heads: true,
                logits_to_keep: 0,
            };
            let cache = s.empty_cache(batch).unwrap();
            let got = s.step(inputs, cache).unwrap().confidence_logit.unwrap();
            for (row, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let err = (sigmoid(g) - sigmoid(w)).abs();
                report.push(format!(
                    "{model} {kind:?} {weights} H[{row}]: |Δ confidence| {err:.1e}"
                ));
                assert!(
                    err <= 1e-5,
                    "{model} {kind:?} {weights} H row {row}: {g} vs {w}"
                );
            }
            for r in &generations {
                let all: Vec<i64> = ["prompt_ids", "generated_ids"]
                    .iter()
                    .flat_map(|k| r[k].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()))
                    .collect();
                let want = r["heads_on_prompt_plus_completion"]["confidence"]
                    .as_f64()
                    .unwrap();
                // The head's output alone, as needle-run fetches it.
                let got = s.confidence_logit(&all).unwrap().unwrap();
                // The reference is written with 6 decimals.
                let err = (sigmoid(got) - sigmoid(want as f32)).abs();
                assert!(
                    err <= 1e-5,
                    "{model} {kind:?} {weights} generation: {got} vs {want}"
                );
            }
        }
    }
    println!("{}", report.join("\n"));
}

/// Graphs with the Needle ops carry the head's pools between calls: each generation's
/// prompt fed in two pieces, then its answer one token a call, gives upstream's
/// confidence over prompt + completion after the last call; and so does a greedy run of
/// the engine, which feeds the answer's last token in one more step.
#[test]
fn the_carried_pools_give_each_generations_confidence() {
    let mut checked = 0;
    for model in MODELS {
        let generations: Vec<serde_json::Value> =
            match std::fs::read_to_string(fixture(&format!("{model}.generate.json"))) {
                Ok(text) => serde_json::from_str(&text).unwrap(),
                Err(_) => continue,
            };
        for kind in [FUSED, Reference] {
            let mut s = session_with(model, kind, MatMulWeights::Packed);
            if !s.has_confidence_head() {
                continue;
            }
            assert!(s.carries_confidence_pools(), "{model} {kind:?}");
            for r in &generations {
                let ids = |k: &str| -> Vec<i64> {
                    r[k].as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_i64().unwrap())
                        .collect()
                };
                let (prompt, answer) = (ids("prompt_ids"), ids("generated_ids"));
                let want = r["heads_on_prompt_plus_completion"]["confidence"]
                    .as_f64()
                    .unwrap();
                let close = |got: f32, how: &str| {
                    // The reference is written with 6 decimals.
                    let err = (sigmoid(got) - sigmoid(want as f32)).abs();
                    assert!(err <= 1e-5, "{model} {kind:?} {how}: {got} vs {want}");
                };
                let half = prompt.len() / 2;
                let cache = s.empty_cache(1).unwrap();
                let mut step = s.forward(&prompt[..half], 1, cache).unwrap();
                step = s.forward(&prompt[half..], 1, step.cache).unwrap();
                for &token in &answer {
                    step = s.forward(&[token], 1, step.cache).unwrap();
                }
                close(step.confidence_logit.unwrap()[0], "fed by hand");

                let prompt: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
                let opts = GenerateOptions {
                    max_new_tokens: answer.len(),
                    stop_ids: vec![],
                    sampling: Sampling::Greedy,
                };
                let run = generate(&mut s, &prompt, &opts).unwrap();
                let generated: Vec<i64> = run.generated_ids.iter().map(|&t| t.into()).collect();
                assert_eq!(generated, answer, "{model} {kind:?}");
                close(run.confidence_logit.unwrap(), "generated");
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no generation of a model with the head");
}
