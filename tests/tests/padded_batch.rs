//! Rows of different lengths in one batch, padded on the right (pad id 0, mask 0, the
//! padding side the graphs record), against each row run alone (which matches upstream,
//! `conformance.rs`): prefill and 16 decode steps, both variants, the fused one also with
//! its in-place cache. A row that is all padding gives finite logits and changes nothing
//! for the others. Rows joining and leaving a running batch are `continuous_batching.rs`.

use graphs::contract::AttentionKind::{self, Reference};
use needle_tests::{row_error, session, MODELS};
use runner::cache::Cache;
use runner::session::{NeedleSession, StepInputs};

const FUSED: AttentionKind = AttentionKind::FUSED;
const LENGTHS: [usize; 3] = [9, 23, 4];
const DECODE_STEPS: usize = 16;
const BOUND: f32 = 1e-5;
const PAD: i64 = 0;

/// Deterministic prompt `r` of `len` tokens (ids above the special ones).
fn prompt(r: usize, len: usize, vocab: usize) -> Vec<i64> {
    (0..len)
        .map(|i| (4 + (i * 37 + r * 101 + 7) % (vocab - 4)) as i64)
        .collect()
}

fn cache(s: &NeedleSession, batch: usize, in_place: bool, capacity: usize) -> Cache {
    match in_place {
        true => s.preallocated_cache(batch, capacity).unwrap(),
        false => s.empty_cache(batch).unwrap(),
    }
}

/// Row `r` alone: the logits of its prompt's positions, then of each forced decode token.
fn solo(
    s: &mut NeedleSession,
    ids: &[i64],
    forced: &[i64],
    in_place: bool,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let vocab = s.config().output_vocab();
    let c = cache(s, 1, in_place, ids.len() + forced.len());
    let mut step = s.forward(ids, 1, c).unwrap();
    let prefill = step.logits.clone();
    let mut decode = Vec::new();
    for &t in forced {
        step = s.forward(&[t], 1, step.cache).unwrap();
        decode.push(step.logits[..vocab].to_vec());
    }
    (prefill, decode)
}

/// The batch: the rows of `prompts` padded to the longest (an empty prompt is a row of
/// padding only), then one forced token per real row and step. Returns the prefill
/// logits `[batch, longest, vocab]` and each step's `[batch, 1, vocab]`.
fn batched(
    s: &mut NeedleSession,
    prompts: &[Vec<i64>],
    forced: &[Vec<i64>],
    in_place: bool,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let batch = prompts.len();
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    let mut positions = Vec::new();
    for p in prompts {
        for i in 0..longest {
            let real = i < p.len();
            ids.push(if real { p[i] } else { PAD });
            mask.push(real as i64);
            positions.push(if real { i as i64 } else { 0 });
        }
    }
    let c = cache(s, batch, in_place, longest + DECODE_STEPS);
    let inputs = StepInputs {
        input_ids: ids,
        attention_mask: mask.clone(),
        position_ids: positions,
        batch,
        heads: false,
        logits_to_keep: 0,
    };
    let mut step = s.step(inputs, c).unwrap();
    let prefill = step.logits.clone();
    let mut rows: Vec<Vec<i64>> = mask.chunks(longest).map(<[i64]>::to_vec).collect();
    let mut decode = Vec::new();
    let per_step = (0..DECODE_STEPS).map(|k| forced.iter().map(move |f| f[k]));
    for (k, tokens) in per_step.enumerate() {
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for ((r, p), token) in prompts.iter().enumerate().zip(tokens) {
            let real = !p.is_empty();
            ids.push(if real { token } else { PAD });
            positions.push(if real { (p.len() + k) as i64 } else { 0 });
            rows[r].push(real as i64);
        }
        let inputs = StepInputs {
            input_ids: ids,
            attention_mask: rows.concat(),
            position_ids: positions,
            batch,
            heads: false,
            logits_to_keep: 0,
        };
        step = s.step(inputs, step.cache).unwrap();
        decode.push(step.logits.clone());
    }
    (prefill, decode)
}

#[test]
fn padded_rows_match_their_single_runs_in_prefill_and_decode() {
    let mut report = Vec::new();
    for model in MODELS {
        for (kind, in_place) in [(FUSED, false), (FUSED, true), (Reference, false)] {
            let mut s = session(model, kind);
            let vocab = s.config().output_vocab();
            let mut prompts: Vec<Vec<i64>> = LENGTHS
                .iter()
                .enumerate()
                .map(|(r, &len)| prompt(r, len, vocab))
                .collect();
            prompts.push(Vec::new());
            let forced: Vec<Vec<i64>> = (0..prompts.len())
                .map(|r| prompt(r + 10, DECODE_STEPS, vocab))
                .collect();
            let (prefill, decode) = batched(&mut s, &prompts, &forced, in_place);
            assert!(
                prefill
                    .iter()
                    .chain(decode.concat().iter())
                    .all(|v| v.is_finite()),
                "{model} {kind} in_place={in_place}: non-finite logits"
            );
            let longest = LENGTHS.iter().max().unwrap();
            let mut worst: f32 = 0.0;
            for (r, &len) in LENGTHS.iter().enumerate() {
                let (want_prefill, want_decode) = solo(&mut s, &prompts[r], &forced[r], in_place);
                let row = &prefill[r * longest * vocab..(r + 1) * longest * vocab];
                let mut err = row_error(row, &want_prefill, len, vocab);
                for (k, want) in want_decode.iter().enumerate() {
                    let got = &decode[k][r * vocab..(r + 1) * vocab];
                    err = err.max(row_error(got, want, 1, vocab));
                }
                assert!(
                    err <= BOUND,
                    "{model} {kind} in_place={in_place} row {r} (length {len}): relative error {err:.2e}"
                );
                worst = worst.max(err);
            }
            report.push(format!(
                "{model} {kind} in_place={in_place}: worst row {worst:.2e}"
            ));
        }
    }
    println!("{}", report.join("\n"));
}
