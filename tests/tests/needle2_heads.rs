//! The Needle 2 probe heads (graph outputs `contrastive_embedding` and `confidence_logit`)
//! against upstream's `encode_contrastive` and `forward_confidence` on `m48h`
//! (`tests/fixtures/make_heads_fixture.py`): a right-padded batch, both variants; and
//! tool retrieval (`Runner::rank_tools`, `--top-tools`) against upstream's cosine
//! scores over a 120-tool catalogue.

use graphs::contract::AttentionKind::{self, Reference};
use graphs::contract::{MatMulWeights, Precision};
use needle_tests::{f32_values, fixture, i64_values, options, session, session_of, session_with};
use runner::answer::Runner;
use runner::load::{LoadOptions, ModelSource};
use runner::provider::Provider;
use runner::python_json::{self, PyJson};
use runner::session::{NeedleSession, StepInputs};
use safetensors::SafeTensors;
use serde_json::Value;
use std::time::Instant;

const FUSED: AttentionKind = AttentionKind::FUSED;

/// Case `H`: `(input_ids, lengths, embeddings, confidence logits)`.
fn case_h() -> (Vec<i64>, Vec<i64>, Vec<f32>, Vec<f32>) {
    let bytes = std::fs::read(fixture("m48h.heads.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    (
        i64_values(&st, "H.input_ids"),
        i64_values(&st, "H.lengths"),
        f32_values(&st, "H.embedding"),
        f32_values(&st, "H.confidence"),
    )
}

/// `(embeddings, confidence logits)` of the right-padded batch `ids`.
fn heads_of(s: &mut NeedleSession, ids: &[i64], lengths: &[i64]) -> (Vec<f32>, Vec<f32>) {
    let batch = lengths.len();
    let seq = ids.len() / batch;
    let mask: Vec<i64> = lengths
        .iter()
        .flat_map(|&n| (0..seq as i64).map(move |t| i64::from(t < n)))
        .collect();
    let inputs = StepInputs {
        input_ids: ids.to_vec(),
        attention_mask: mask,
        position_ids: (0..batch).flat_map(|_| 0..seq as i64).collect(),
        batch,
        heads: true,
        logits_to_keep: 0,
    };
    let out = s.step(inputs, s.empty_cache(batch).unwrap()).unwrap();
    (
        out.contrastive_embedding.unwrap(),
        out.confidence_logit.unwrap(),
    )
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_heads_match_upstream_on_a_padded_batch() {
    let (ids, lengths, want_embedding, want_confidence) = case_h();
    let weights = [MatMulWeights::Float, MatMulWeights::Packed];
    for (kind, weights) in [FUSED, Reference]
        .into_iter()
        .flat_map(|k| weights.map(|w| (k, w)))
    {
        let mut s = session_with("m48h", kind, weights);
        assert!(s.has_contrastive_head() && s.has_confidence_head());
        let (embedding, confidence) = heads_of(&mut s, &ids, &lengths);
        let (e, c) = (
            max_abs_diff(&embedding, &want_embedding),
            max_abs_diff(&confidence, &want_confidence),
        );
        println!(
            "m48h {kind:?} {weights}, rows of {lengths:?} tokens: max |Δ embedding| {e:.1e}, max |Δ confidence logit| {c:.1e}"
        );
        assert!(e <= 1e-5 && c <= 1e-5, "{kind:?} {weights}: {e} {c}");
    }
    // fp16 is the CUDA path's precision; on the CPU it only has to run and stay close.
    let bytes = std::fs::read(fixture("m48h.cact")).unwrap();
    let opts = options(FUSED, Precision::Fp16, MatMulWeights::Float);
    let mut s = session_of(&bytes, &opts, Provider::Cpu);
    let (embedding, confidence) = heads_of(&mut s, &ids, &lengths);
    let (e, c) = (
        max_abs_diff(&embedding, &want_embedding),
        max_abs_diff(&confidence, &want_confidence),
    );
    println!("m48h fp16: max |Δ embedding| {e:.1e}, max |Δ confidence logit| {c:.1e}");
    assert!(e < 0.05 && c < 0.05, "fp16: {e} {c}");
}

/// The packed graphs carry the confidence head's pools: each row of case `H` fed alone,
/// its first tokens in one call and the rest one a call, gives upstream's confidence of
/// the row whole after its last call.
#[test]
fn the_carried_pools_give_each_rows_confidence_fed_in_pieces() {
    let (ids, lengths, _, want) = case_h();
    let seq = ids.len() / lengths.len();
    for kind in [FUSED, Reference] {
        let mut s = session_with("m48h", kind, MatMulWeights::Packed);
        assert!(s.carries_confidence_pools(), "{kind:?}");
        for (row, &n) in lengths.iter().enumerate() {
            let tokens = &ids[row * seq..row * seq + n as usize];
            let first = tokens.len().div_ceil(2);
            let mut step = s
                .forward(&tokens[..first], 1, s.empty_cache(1).unwrap())
                .unwrap();
            for &token in &tokens[first..] {
                step = s.forward(&[token], 1, step.cache).unwrap();
            }
            let got = step.confidence_logit.unwrap()[0];
            let err = (got - want[row]).abs();
            println!("m48h {kind:?} packed row {row}, carried: |Δ confidence logit| {err:.1e}");
            assert!(err <= 1e-5, "{kind:?} row {row}: {got} vs {}", want[row]);
        }
    }
}

#[test]
fn a_model_without_heads_has_no_head_outputs_and_cannot_rank_tools() {
    for kind in [FUSED, Reference] {
        let s = session("m48", kind);
        assert!(!s.has_contrastive_head() && !s.has_confidence_head());
    }
    let mut runner = runner_for("m48", FUSED);
    let err = runner.rank_tools(&catalogue().0, "hello").unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model has no contrastive head (its heads.manifest lists none), so it cannot rank tools"
    );
}

fn runner_for(model: &str, attention: AttentionKind) -> Runner {
    let source = ModelSource::Path(fixture(&format!("{model}.cact")));
    let options = LoadOptions {
        attention: Some(attention),
        ..LoadOptions::default()
    };
    Runner::new(&source, &options).unwrap()
}

/// One query of the retrieval fixture: the query, upstream's cosine to each tool, and its
/// ranking of the tools.
type RetrievalCase = (String, Vec<f64>, Vec<usize>);

/// The retrieval fixture: the tools and upstream's cases.
fn catalogue() -> (Vec<PyJson>, Vec<RetrievalCase>) {
    let text = std::fs::read_to_string(fixture("m48h.retrieval.json")).unwrap();
    let PyJson::Object(members) = python_json::loads(&text).unwrap() else {
        panic!("not an object")
    };
    let tools = match &members[0] {
        (key, PyJson::Array(tools)) if key == "tools" => tools.clone(),
        _ => panic!("no tools"),
    };
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let numbers = |k: &str| c[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap());
            (
                c["query"].as_str().unwrap().to_string(),
                numbers("scores").collect(),
                numbers("ranking").map(|i| i as usize).collect(),
            )
        })
        .collect();
    (tools, cases)
}

#[test]
fn rank_tools_matches_upstreams_ranking_of_120_tools() {
    let (tools, cases) = catalogue();
    assert!(tools.len() >= 100);
    for kind in [FUSED, Reference] {
        let mut runner = runner_for("m48h", kind);
        let mut worst = 0f64;
        for (query, want_scores, want_ranking) in &cases {
            let started = Instant::now();
            let ranked = runner.rank_tools(&tools, query).unwrap();
            let elapsed = started.elapsed();
            for &(i, score) in &ranked {
                worst = worst.max((f64::from(score) - want_scores[i]).abs());
            }
            let order: Vec<usize> = ranked.iter().map(|&(i, _)| i).collect();
            assert_eq!(&order, want_ranking, "{kind:?} {query:?}");
            println!(
                "m48h {kind:?}: ranked {} tools for {query:?} in {:.1} ms (best: {:?})",
                tools.len(),
                elapsed.as_secs_f64() * 1e3,
                &ranked[..3]
            );
        }
        println!("m48h {kind:?}: max |Δ cosine| vs upstream {worst:.1e}");
        assert!(worst <= 1e-5, "{kind:?}: {worst}");
    }
}

#[test]
fn top_tools_fit_the_context_where_the_catalogue_does_not() {
    let (tools, cases) = catalogue();
    let mut runner = runner_for("m48h", FUSED);
    let query = &cases[2].0;
    let prompt_of = |tools: Vec<PyJson>| Value::String(PyJson::Array(tools).dumps_compact());
    let err = runner
        .complete(&prompt_of(tools.clone()), query, None, 4)
        .unwrap_err()
        .to_string();
    println!("all {} tools: {err}", tools.len());
    assert!(
        err.contains("more than the model's max_seq_len 512"),
        "{err}"
    );
    let top = runner.top_tools(&tools, query, 3).unwrap();
    let best: Vec<PyJson> = cases[2].2[..3].iter().map(|&i| tools[i].clone()).collect();
    assert_eq!(top, best);
    let answer = runner.complete(&prompt_of(top), query, None, 4).unwrap();
    println!(
        "top 3 tools: a {}-token prompt (max_seq_len 512), confidence {:?}",
        answer.prompt_tokens, answer.confidence
    );
    assert!(answer.prompt_tokens <= 512);
    assert!(answer.confidence.is_some_and(|c| (0.0..=1.0).contains(&c)));
}
