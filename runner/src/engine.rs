//! Continuous batching: rows join a running batch at a step boundary and leave it when
//! they are done. Newcomers are prefilled together (onnxruntime's GroupQueryAttention
//! takes several tokens per row only with an empty cache), then put into the running
//! batch's cache beside the rows already decoding ([`crate::cache_rows`]); every step
//! decodes one token for every row. Each row stops, samples and is constrained exactly as
//! its single run, and its logits are its single run's (the graphs are batch-exact), so
//! its answer is the one it gets alone. `needle-run --batch` and single runs are the case
//! where every row is admitted at once; `needle-run serve` admits requests as they come.

use crate::generate::{self, check_prompt, GenerateOptions, Generation, Sampler, TokenFilter};
use crate::session::{Cache, NeedleSession, StepInputs};
use anyhow::Result;
use std::time::Instant;

/// A row's handle, unique within its engine.
pub type RowId = u64;

/// A prompt to generate after.
pub struct Admission<F> {
    /// With BOS if the caller wants it.
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    /// Restricts the row's tokens (and sees each one it generates).
    pub filter: Option<F>,
}

/// A row that is done: its generation, or why it failed (its filter refused a token).
pub struct Finished {
    pub id: RowId,
    pub generation: Result<Generation>,
}

/// The running batch.
pub struct Engine<F> {
    rows: Vec<Row<F>>,
    /// The rows' cache; its column count is every row's mask width.
    cache: Option<Cache>,
    next_id: RowId,
}

struct Row<F> {
    id: RowId,
    prompt_len: usize,
    opts: GenerateOptions,
    filter: Option<F>,
    sampler: Sampler,
    generated: Vec<u32>,
    stopped_on: Option<u32>,
    /// The logits the next token is picked from.
    logits: Vec<f32>,
    /// This row's attention-mask columns.
    mask: Vec<i64>,
    prefill_secs: f64,
    decode_secs: f64,
    decode_tokens: usize,
}

impl<F> Row<F> {
    /// Tokens the row has in the cache.
    fn cached(&self) -> usize {
        self.prompt_len + self.decode_tokens
    }

    /// Tokens it may still generate.
    fn remaining(&self) -> usize {
        self.opts
            .max_new_tokens
            .saturating_sub(self.generated.len())
    }

    fn finished(self) -> Generation {
        Generation {
            generated_ids: self.generated,
            stopped_on: self.stopped_on,
            prefill_tokens: self.prompt_len,
            prefill_secs: self.prefill_secs,
            decode_tokens: self.decode_tokens,
            decode_secs: self.decode_secs,
        }
    }
}

impl<F: TokenFilter> Row<F> {
    /// Picks the next token: `Some` to feed it, `None` when the row is done (a stop token,
    /// a full context, or the last token it may generate). Like upstream
    /// `generate_cached`, a token is kept only if it still fits the context.
    fn advance(&mut self, max_len: usize) -> Result<Option<u32>> {
        if self.remaining() == 0 {
            return Ok(None);
        }
        if let Some(filter) = self.filter.as_mut() {
            filter.mask(&mut self.logits)?;
        }
        let next = self.sampler.pick(&self.logits);
        if self.opts.stop_ids.contains(&next) {
            self.stopped_on = Some(next);
            return Ok(None);
        }
        if self.prompt_len + self.generated.len() >= max_len {
            return Ok(None);
        }
        if let Some(filter) = self.filter.as_mut() {
            filter.accept(next)?;
        }
        self.generated.push(next);
        Ok((self.remaining() > 0).then_some(next))
    }
}

impl<F: TokenFilter> Default for Engine<F> {
    fn default() -> Self {
        Engine {
            rows: Vec::new(),
            cache: None,
            next_id: 0,
        }
    }
}

impl<F: TokenFilter> Engine<F> {
    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Prefills `admissions` together and adds them to the batch; their ids, in order.
    /// A prompt that generation cannot start from fails the whole admission.
    pub fn admit(
        &mut self,
        session: &mut NeedleSession,
        admissions: Vec<Admission<F>>,
    ) -> Result<Vec<RowId>> {
        let max_len = session.config().max_seq_len();
        for (i, a) in admissions.iter().enumerate() {
            let checked = check_prompt(&a.prompt, max_len);
            match admissions.len() {
                1 => checked?,
                _ => anyhow::Context::with_context(checked, || format!("prompt {i} of the batch"))?,
            }
        }
        if admissions.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let prompts: Vec<&[u32]> = admissions.iter().map(|a| &a.prompt[..]).collect();
        let most_new = admissions.iter().map(|a| a.opts.max_new_tokens).max();
        let (cache, logits) = prefill(session, &prompts, most_new.unwrap_or(0))?;
        let prefill_secs = start.elapsed().as_secs_f64();
        let width = cache.len();
        let ids: Vec<RowId> = (self.next_id..).take(admissions.len()).collect();
        self.next_id += admissions.len() as RowId;
        let newcomers: Vec<Row<F>> = admissions
            .into_iter()
            .zip(logits)
            .zip(&ids)
            .map(|((a, logits), &id)| Row {
                id,
                prompt_len: a.prompt.len(),
                sampler: Sampler::new(a.opts.sampling),
                opts: a.opts,
                filter: a.filter,
                generated: Vec::new(),
                stopped_on: None,
                logits,
                mask: (0..width).map(|c| i64::from(c < a.prompt.len())).collect(),
                prefill_secs,
                decode_secs: 0.0,
                decode_tokens: 0,
            })
            .collect();
        match self.cache.take() {
            None => {
                self.rows = newcomers;
                self.cache = Some(cache);
            }
            Some(running) => {
                let old = std::mem::take(&mut self.rows);
                let keep_old: Vec<usize> = (0..old.len()).collect();
                let keep_new: Vec<usize> = (0..newcomers.len()).collect();
                let mut parts = session.split_rows(&running, &masks(&old), &keep_old)?;
                drop(running);
                parts.extend(session.split_rows(&cache, &masks(&newcomers), &keep_new)?);
                drop(cache);
                self.rows = old.into_iter().chain(newcomers).collect();
                self.rejoin(session, parts)?;
            }
        }
        Ok(ids)
    }

    /// Takes the rows `ids` out of the batch without finishing them (cancelled requests).
    pub fn cancel(&mut self, session: &mut NeedleSession, ids: &[RowId]) -> Result<()> {
        let keep: Vec<bool> = self.rows.iter().map(|r| !ids.contains(&r.id)).collect();
        self.retain(session, &keep).map(drop)
    }

    /// Picks every row's next token, takes the rows that are done out of the batch, and
    /// decodes one step for the others. Returns the rows that finished.
    pub fn step(&mut self, session: &mut NeedleSession) -> Result<Vec<Finished>> {
        let max_len = session.config().max_seq_len();
        let mut fed = Vec::with_capacity(self.rows.len());
        let mut failed = Vec::new();
        let keep: Vec<bool> = self
            .rows
            .iter_mut()
            .map(|row| match row.advance(max_len) {
                Ok(Some(token)) => {
                    fed.push(token);
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    failed.push((row.id, e));
                    false
                }
            })
            .collect();
        let finished: Vec<Finished> = self
            .retain(session, &keep)?
            .into_iter()
            .map(|row| {
                let at = failed.iter().position(|(id, _)| *id == row.id);
                Finished {
                    id: row.id,
                    generation: match at {
                        Some(at) => Err(failed.swap_remove(at).1),
                        None => Ok(row.finished()),
                    },
                }
            })
            .collect();
        if self.rows.is_empty() {
            return Ok(finished);
        }
        let cache = self.cache.take().expect("a running batch has a cache");
        let inputs = StepInputs {
            input_ids: fed.iter().map(|&t| i64::from(t)).collect(),
            attention_mask: self
                .rows
                .iter_mut()
                .flat_map(|row| {
                    row.mask.push(1);
                    row.mask.iter().copied()
                })
                .collect(),
            position_ids: self.rows.iter().map(|r| r.cached() as i64).collect(),
            batch: self.rows.len(),
        };
        let start = Instant::now();
        let step = session.step(inputs, cache)?;
        let secs = start.elapsed().as_secs_f64();
        let vocab = session.config().output_vocab();
        for (r, row) in self.rows.iter_mut().enumerate() {
            row.logits.clear();
            row.logits
                .extend_from_slice(&step.logits[r * vocab..(r + 1) * vocab]);
            row.decode_tokens += 1;
            row.decode_secs += secs;
        }
        self.cache = Some(step.cache);
        Ok(finished)
    }

    /// Keeps the rows `keep` marks; returns the others, taken out of the batch.
    fn retain(&mut self, session: &mut NeedleSession, keep: &[bool]) -> Result<Vec<Row<F>>> {
        if keep.iter().all(|&k| k) {
            return Ok(Vec::new());
        }
        let kept: Vec<usize> = (0..keep.len()).filter(|&r| keep[r]).collect();
        let running = self.cache.take();
        let parts = match (&running, kept.is_empty()) {
            (Some(cache), false) => session.split_rows(cache, &masks(&self.rows), &kept)?,
            _ => Vec::new(),
        };
        drop(running);
        let mut left = Vec::new();
        let mut rows = Vec::with_capacity(kept.len());
        for (row, keep) in std::mem::take(&mut self.rows).into_iter().zip(keep) {
            match keep {
                true => rows.push(row),
                false => left.push(row),
            }
        }
        self.rows = rows;
        if !self.rows.is_empty() {
            self.rejoin(session, parts)?;
        }
        Ok(left)
    }

    /// Puts `parts` (the rows of `self.rows`, in order) into one cache, with room for every
    /// row to finish: between two rejoins all rows grow together, so the batch never gets
    /// wider than its widest row's prompt and budget.
    fn rejoin(
        &mut self,
        session: &mut NeedleSession,
        parts: Vec<crate::cache_rows::RowCache>,
    ) -> Result<()> {
        let capacity = self
            .rows
            .iter()
            .map(|r| r.cached() + r.remaining())
            .max()
            .unwrap_or(0);
        let (cache, masks) = session.join_rows(&parts, capacity)?;
        for (row, mask) in self.rows.iter_mut().zip(masks) {
            row.mask = mask;
        }
        self.cache = Some(cache);
        Ok(())
    }
}

fn masks<F>(rows: &[Row<F>]) -> Vec<&[i64]> {
    rows.iter().map(|r| &r.mask[..]).collect()
}

/// Runs `prompts` from an empty cache (with room for `most_new` more tokens each): one
/// prompt in the pieces the run plan says ([`generate::prefill`]), several in one call,
/// padded on the right. Returns the cache and each prompt's last logits.
fn prefill(
    session: &mut NeedleSession,
    prompts: &[&[u32]],
    most_new: usize,
) -> Result<(Cache, Vec<Vec<f32>>)> {
    let vocab = session.config().output_vocab();
    if let [prompt] = prompts {
        let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
        let out = generate::prefill(session, &ids, ids.len() + most_new)?;
        let last = out.logits[out.logits.len() - vocab..].to_vec();
        return Ok((out.cache, vec![last]));
    }
    let batch = prompts.len();
    let pad = i64::from(session.description.tokenizer.pad_id);
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let mut inputs = StepInputs {
        input_ids: Vec::with_capacity(batch * longest),
        attention_mask: Vec::with_capacity(batch * longest),
        position_ids: Vec::with_capacity(batch * longest),
        batch,
    };
    for prompt in prompts {
        for i in 0..longest {
            let token = prompt.get(i);
            inputs.input_ids.push(token.map_or(pad, |&t| i64::from(t)));
            inputs.attention_mask.push(i64::from(token.is_some()));
            inputs
                .position_ids
                .push(if token.is_some() { i as i64 } else { 0 });
        }
    }
    let cache = session.preallocated_cache(batch, longest + most_new)?;
    let step = session.step(inputs, cache)?;
    let logits = prompts
        .iter()
        .enumerate()
        .map(|(r, prompt)| {
            let at = (r * longest + prompt.len() - 1) * vocab;
            step.logits[at..at + vocab].to_vec()
        })
        .collect();
    Ok((step.cache, logits))
}
