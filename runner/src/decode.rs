//! Decoding one token at a time, under both the one-shot API ([`crate::generate`]) and
//! the engine ([`crate::engine`]): what to generate ([`GenerateOptions`], [`Sampling`]),
//! how a token is picked ([`Sampler`]) and restricted ([`TokenFilter`]), what a run
//! gives back ([`Decoded`]), and a prompt's prefill in the run plan's pieces.

use crate::cache::Cache;
use crate::session::NeedleSession;
use crate::step::StepOutput;
use anyhow::{bail, Result};

/// How the next token is chosen from the last position's logits.
#[derive(Clone, Copy, Debug)]
pub enum Sampling {
    /// Argmax (the first maximum on ties, like `jnp.argmax`).
    Greedy,
    /// Softmax of `logits / temperature`, drawn from a seeded generator.
    Temperature { temperature: f32, seed: u64 },
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Generation ends when one of these is produced; it is not part of the output.
    pub stop_ids: Vec<u32>,
    pub sampling: Sampling,
}

/// What one run decoded: its tokens, why it stopped, and the time of both phases.
#[derive(Clone, Debug)]
pub struct Decoded {
    pub generated_ids: Vec<u32>,
    /// The stop token that ended generation, if any.
    pub stopped_on: Option<u32>,
    /// Whether generation ended because the row's filter found its output complete
    /// ([`TokenFilter::complete`]: a stop sequence appeared); the tokens are kept.
    pub completed_by_filter: bool,
    /// Whether the row's filter had to close its output at the end of the budget
    /// ([`TokenFilter::ran_on`]).
    pub ran_on: bool,
    pub prefill_tokens: usize,
    /// Of the prompt's tokens, those not run: their cache came from a prompt this one
    /// continues ([`crate::cache::prefix`]).
    pub cached_prompt_tokens: usize,
    pub prefill_secs: f64,
    pub decode_tokens: usize,
    pub decode_secs: f64,
    /// The confidence head's logit over the prompt and every generated token, where the
    /// graph carries the head's pools (`None`: a forward over them gives it).
    pub confidence_logit: Option<f32>,
}

impl Decoded {
    /// Prompt tokens per second of the prefill.
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_secs)
    }

    /// Tokens per second of the cached one-token steps.
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_tokens, self.decode_secs)
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// Restricts which tokens may come next (constrained decoding).
pub trait TokenFilter {
    /// Sets the logits of the tokens that may not come next to −∞.
    fn mask(&mut self, logits: &mut [f32]) -> Result<()>;
    /// Moves past the chosen `token`.
    fn accept(&mut self, token: u32) -> Result<()>;
    /// Whether the output is complete after the tokens accepted so far (a stop sequence
    /// appeared in its text): generation ends there, keeping them.
    fn complete(&self) -> bool {
        false
    }
    /// Whether the filter, near the end of its budget, overrode the model's choice to
    /// close the output: the output ran on (a word repeated until the budget ended) and
    /// its end is the filter's, not the model's.
    fn ran_on(&self) -> bool {
        false
    }
}

impl<T: TokenFilter + ?Sized> TokenFilter for &mut T {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        (**self).mask(logits)
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        (**self).accept(token)
    }

    fn complete(&self) -> bool {
        (**self).complete()
    }

    fn ran_on(&self) -> bool {
        (**self).ran_on()
    }
}

impl<T: TokenFilter + ?Sized> TokenFilter for Box<T> {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        (**self).mask(logits)
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        (**self).accept(token)
    }

    fn complete(&self) -> bool {
        (**self).complete()
    }

    fn ran_on(&self) -> bool {
        (**self).ran_on()
    }
}

/// Refuses a prompt that generation cannot start from: an empty one or one longer than
/// the model's `max_seq_len`.
pub fn check_prompt(prompt_ids: &[u32], max_len: usize) -> Result<()> {
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt_ids.len() > max_len {
        bail!(
            "the prompt has {} tokens, more than the model's max_seq_len {max_len}",
            prompt_ids.len()
        );
    }
    Ok(())
}

/// Runs the prompt `ids` (batch 1) from an empty cache with room for `capacity` tokens
/// (as the plan's [`crate::plan::RunPlan::cache_room`] has it), in the pieces the run plan
/// says ([`crate::plan::RunPlan::prefill_chunk`]). The logits are those of the last piece.
pub fn prefill(session: &mut NeedleSession, ids: &[i64], capacity: usize) -> Result<StepOutput> {
    let first = session
        .plan
        .prefill_chunk
        .unwrap_or(ids.len())
        .min(ids.len());
    let cache = session.preallocated_cache(1, session.plan.cache_room(first, capacity))?;
    prefill_after(session, ids, cache)
}

/// Runs `ids` (batch 1) after `cache` as [`prefill`] does, its pieces ending where a
/// prefill of the whole prompt ends its own, so that only the first piece differs from
/// that prefill's.
pub fn prefill_after(session: &mut NeedleSession, ids: &[i64], cache: Cache) -> Result<StepOutput> {
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    let chunk = session
        .plan
        .prefill_chunk
        .unwrap_or(cache.seen() + ids.len());
    let (first, rest) = ids.split_at((chunk - cache.seen() % chunk).min(ids.len()));
    // Only the prompt's last token's logits are read: each piece keeps its last alone.
    let mut step = session.forward_keeping(first, 1, cache, 1)?;
    for piece in rest.chunks(chunk) {
        step = session.forward_keeping(piece, 1, step.cache, 1)?;
    }
    Ok(step)
}

/// Picks tokens from logits; owns the random state of temperature sampling.
pub struct Sampler {
    sampling: Sampling,
    state: u64,
}

impl Sampler {
    pub fn new(sampling: Sampling) -> Self {
        let state = match sampling {
            Sampling::Temperature { seed, .. } => seed,
            Sampling::Greedy => 0,
        };
        Sampler { sampling, state }
    }

    /// The next token for one position's logits.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        match self.sampling {
            Sampling::Greedy => argmax(logits),
            Sampling::Temperature { temperature, .. } if temperature <= 0.0 => argmax(logits),
            Sampling::Temperature { temperature, .. } => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f64> = logits
                    .iter()
                    .map(|&l| (((l - max) / temperature) as f64).exp())
                    .collect();
                let total: f64 = weights.iter().sum();
                let mut target = self.next_unit() * total;
                for (i, w) in weights.iter().enumerate() {
                    if target < *w {
                        return i as u32;
                    }
                    target -= w;
                }
                argmax(logits)
            }
        }
    }

    /// A uniform draw in [0, 1) from splitmix64.
    fn next_unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the first maximum.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}
