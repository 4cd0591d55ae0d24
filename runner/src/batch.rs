//! Many prompts generated together through one batch (`needle-run --batch`): rows padded
//! on the right, which the graphs are exact for (each row's logits are its single run's,
//! `tests/tests/batch.rs`), prefilled in the same pieces as a single run, then one step for
//! every row still generating; a finished row is padding from then on. One prompt is
//! [`crate::generate::generate_filtered`]'s single run; each row of a batch stops, samples
//! and is constrained exactly as its single run.

use crate::generate::{check_prompt, GenerateOptions, Generation, Sampler, TokenFilter};
use crate::session::{NeedleSession, StepInputs};
use anyhow::{Context, Result};
use std::time::Instant;

/// Generates after each of `prompts` (each with BOS if the caller wants it); `filters[r]`
/// restricts row `r`. The generations share the batch's prefill and decode times.
pub fn generate_batch(
    session: &mut NeedleSession,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    mut filters: Vec<Option<&mut dyn TokenFilter>>,
) -> Result<Vec<Generation>> {
    let batch = prompts.len();
    let max_len = session.config().max_seq_len();
    for (r, p) in prompts.iter().enumerate() {
        let checked = check_prompt(p, max_len);
        match batch {
            1 => checked?,
            _ => checked.with_context(|| format!("prompt {r} of the batch"))?,
        }
    }
    if batch == 0 {
        return Ok(Vec::new());
    }
    let pad = i64::from(session.description.tokenizer.pad_id);
    let vocab = session.config().output_vocab();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let token = |r: usize, i: usize| prompts[r].get(i).map_or(pad, |&t| i64::from(t));
    let real = |r: usize, i: usize| i64::from(i < prompts[r].len());

    let start = Instant::now();
    let mut cache = session.preallocated_cache(batch, longest + opts.max_new_tokens)?;
    let mut next_logits = vec![Vec::new(); batch];
    // onnxruntime's GroupQueryAttention takes a batch of several tokens per row only with
    // an empty cache, so a batch is prefilled in one call (a single run may go in pieces:
    // the same logits to ~1e-6).
    let chunk = match batch {
        1 => session.plan.prefill_chunk.unwrap_or(longest),
        _ => longest,
    }
    .max(1);
    for from in (0..longest).step_by(chunk) {
        let to = (from + chunk).min(longest);
        let columns = |f: &dyn Fn(usize, usize) -> i64, range: std::ops::Range<usize>| {
            (0..batch)
                .flat_map(|r| range.clone().map(move |i| f(r, i)))
                .collect::<Vec<i64>>()
        };
        let inputs = StepInputs {
            input_ids: columns(&token, from..to),
            attention_mask: columns(&real, 0..to),
            position_ids: columns(&|r, i| if real(r, i) == 1 { i as i64 } else { 0 }, from..to),
            batch,
        };
        let step = session.step(inputs, cache)?;
        for (r, prompt) in prompts.iter().enumerate() {
            let last = prompt.len() - 1;
            if (from..to).contains(&last) {
                let at = (r * (to - from) + last - from) * vocab;
                next_logits[r] = step.logits[at..at + vocab].to_vec();
            }
        }
        cache = step.cache;
    }
    let prefill_secs = start.elapsed().as_secs_f64();

    let mut masks: Vec<Vec<i64>> = (0..batch)
        .map(|r| (0..longest).map(|i| real(r, i)).collect())
        .collect();
    let mut samplers: Vec<Sampler> = (0..batch).map(|_| Sampler::new(opts.sampling)).collect();
    let mut generated = vec![Vec::new(); batch];
    let mut stopped_on = vec![None; batch];
    let mut decode_tokens = 0;
    let start = Instant::now();
    loop {
        let mut fed = vec![None; batch];
        for r in 0..batch {
            if next_logits[r].is_empty() {
                continue;
            }
            let logits = &mut next_logits[r];
            if let Some(filter) = filters[r].as_mut() {
                filter.mask(logits)?;
            }
            let next = samplers[r].pick(logits);
            logits.clear();
            if opts.stop_ids.contains(&next) {
                stopped_on[r] = Some(next);
                continue;
            }
            if prompts[r].len() + generated[r].len() >= max_len {
                continue;
            }
            if let Some(filter) = filters[r].as_mut() {
                filter.accept(next)?;
            }
            generated[r].push(next);
            if generated[r].len() < opts.max_new_tokens {
                fed[r] = Some(next);
            }
        }
        if fed.iter().all(Option::is_none) {
            break;
        }
        let mut position_ids = Vec::with_capacity(batch);
        for (r, token) in fed.iter().enumerate() {
            let position = prompts[r].len() + generated[r].len() - 1;
            position_ids.push(if token.is_some() { position as i64 } else { 0 });
            masks[r].push(i64::from(token.is_some()));
        }
        let inputs = StepInputs {
            input_ids: fed.iter().map(|t| t.map_or(pad, i64::from)).collect(),
            attention_mask: masks.concat(),
            position_ids,
            batch,
        };
        let step = session.step(inputs, cache)?;
        for (r, token) in fed.iter().enumerate() {
            if token.is_some() {
                next_logits[r] = step.logits[r * vocab..(r + 1) * vocab].to_vec();
            }
        }
        cache = step.cache;
        decode_tokens += fed.iter().flatten().count();
    }
    let decode_secs = start.elapsed().as_secs_f64();
    Ok(generated
        .into_iter()
        .zip(stopped_on)
        .zip(prompts)
        .map(|((generated_ids, stopped_on), prompt)| Generation {
            generated_ids,
            stopped_on,
            prefill_tokens: prompt.len(),
            prefill_secs,
            decode_tokens,
            decode_secs,
        })
        .collect())
}
