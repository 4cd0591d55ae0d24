//! Continuous batching: rows join a running batch at a step boundary and leave it when
//! they are done. Newcomers are prefilled together (onnxruntime's GroupQueryAttention
//! takes several tokens per row only with an empty cache), then put into the running
//! batch's cache beside the rows already decoding ([`crate::cache::rows`]); every step
//! decodes one token for every row. A row that is done leaves its slot behind as padding
//! (a pad token, mask 0), so leaving copies nothing, and a newcomer takes a free slot,
//! copying only its own part of the cache. The cache is laid out anew (every live row
//! copied) only when the batch must grow, when as many slots are free as taken, or when
//! its columns would outgrow it; where every layer attends within a window, a full cache
//! slides instead ([`crate::cache::slide`]: each row's oldest tokens out). Each row stops, samples and is constrained exactly as
//! its single run, and its logits are its single run's (the graphs are batch-exact), so
//! its answer is the one it gets alone. `needle-run --batch` and single runs are the case
//! where every row is admitted at once; `needle-run serve` admits requests as they come.

use crate::cache::prefix::PrefixStore;
use crate::cache::rows::{self, padded_mask, RowCache};
use crate::cache::{slide, Cache};
use crate::decode::{self, check_prompt, Decoded, GenerateOptions, Sampler, TokenFilter};
use crate::session::NeedleSession;
use crate::step::{StepInputs, StepOutput};
use anyhow::{Context, Result};
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

/// A row that is done: what it decoded, or why it failed (its filter refused a token).
pub struct Finished {
    pub id: RowId,
    pub decoded: Result<Decoded>,
}

/// The running batch.
pub struct Engine<F> {
    slots: Vec<Slot<F>>,
    /// The slots' cache; its column count is every slot's mask width.
    cache: Option<Cache>,
    next_id: RowId,
    /// Prompts a lone newcomer may continue; none unless asked for.
    prefixes: Option<PrefixStore>,
}

/// One row of the batch's cache: a row generating, or a free one (padding).
struct Slot<F> {
    row: Option<Row<F>>,
    /// The slot's attention-mask columns.
    mask: Vec<i64>,
}

struct Row<F> {
    id: RowId,
    prompt_len: usize,
    cached_prompt_tokens: usize,
    opts: GenerateOptions,
    filter: Option<F>,
    sampler: Sampler,
    generated: Vec<u32>,
    stopped_on: Option<u32>,
    completed_by_filter: bool,
    /// The logits the next token is picked from.
    logits: Vec<f32>,
    /// The confidence head's logit over every token the row has fed, where the graph
    /// carries the head's pools.
    confidence_logit: Option<f32>,
    /// Done, its last token being fed so that the confidence covers it: the row leaves
    /// after this step.
    closing: bool,
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

    /// The token picked last (which the next step feeds).
    fn last_generated(&self) -> Option<u32> {
        self.generated.last().copied()
    }

    /// Room for every token the row may feed: its prompt and all it may generate.
    fn budget(&self) -> usize {
        self.prompt_len + self.opts.max_new_tokens
    }

    /// Whether its last generated token has not been fed (the row stopped on its budget or
    /// its filter, not on a stop token).
    fn last_unfed(&self) -> bool {
        self.generated.len() > self.decode_tokens
    }
}

impl<F: TokenFilter> Row<F> {
    fn finished(self) -> Decoded {
        Decoded {
            ran_on: self.filter.as_ref().is_some_and(F::ran_on),
            generated_ids: self.generated,
            stopped_on: self.stopped_on,
            completed_by_filter: self.completed_by_filter,
            prefill_tokens: self.prompt_len,
            cached_prompt_tokens: self.cached_prompt_tokens,
            prefill_secs: self.prefill_secs,
            decode_tokens: self.decode_tokens,
            decode_secs: self.decode_secs,
            confidence_logit: self.confidence_logit,
        }
    }

    /// Picks the next token: `Some` to feed it, `None` when the row is done (a stop token,
    /// a full context, the last token it may generate, or its filter found the output
    /// complete). Like upstream
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
        if self.filter.as_ref().is_some_and(F::complete) {
            self.completed_by_filter = true;
            return Ok(None);
        }
        Ok((self.remaining() > 0).then_some(next))
    }
}

impl<F: TokenFilter> Default for Engine<F> {
    fn default() -> Self {
        Engine {
            slots: Vec::new(),
            cache: None,
            next_id: 0,
            prefixes: None,
        }
    }
}

impl<F: TokenFilter> Engine<F> {
    /// An engine that remembers the last `prompts` prompts it prefilled alone, with their
    /// cache, and prefills a lone newcomer that continues one of them from there.
    pub fn with_prefix_reuse(prompts: usize) -> Self {
        Engine {
            prefixes: Some(PrefixStore::new(prompts)),
            ..Engine::default()
        }
    }

    /// Rows generating.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.row.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every row and the batch's cache (after a failed call left them half
    /// updated); the prompts remembered stay, being copies.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.cache = None;
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
                _ => checked.with_context(|| format!("prompt {i} of the batch"))?,
            }
        }
        if admissions.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let prompts: Vec<&[u32]> = admissions.iter().map(|a| &a.prompt[..]).collect();
        let most_new = admissions.iter().map(|a| a.opts.max_new_tokens).max();
        let prefixes = self.prefixes.as_mut();
        let (prefilled, lasts, cached) =
            prefill(session, &prompts, most_new.unwrap_or(0), prefixes)?;
        let prefill_secs = start.elapsed().as_secs_f64();
        // A lone prompt's cache may have slid ([`slide`]): its columns, all real, are the
        // prompt's last tokens.
        let width = match &prefilled {
            Prefilled::Cache(cache) => cache.len(),
            Prefilled::Rows(rows) => rows::width(rows),
        };
        let ids: Vec<RowId> = (self.next_id..).take(admissions.len()).collect();
        self.next_id += admissions.len() as RowId;
        let newcomers: Vec<Slot<F>> = admissions
            .into_iter()
            .zip(lasts)
            .zip(&ids)
            .zip(cached)
            .map(|(((a, last), &id), cached_prompt_tokens)| Slot {
                mask: padded_mask(a.prompt.len(), width),
                row: Some(Row {
                    id,
                    prompt_len: a.prompt.len(),
                    cached_prompt_tokens,
                    sampler: Sampler::new(a.opts.sampling),
                    opts: a.opts,
                    filter: a.filter,
                    generated: Vec::new(),
                    stopped_on: None,
                    completed_by_filter: false,
                    logits: last.logits,
                    confidence_logit: last.confidence_logit,
                    closing: false,
                    prefill_secs,
                    decode_secs: 0.0,
                    decode_tokens: 0,
                }),
            })
            .collect();
        if self.is_empty() {
            self.slots = newcomers;
            match prefilled {
                Prefilled::Cache(cache) => self.cache = Some(cache),
                Prefilled::Rows(rows) => self.rejoin(session, rows)?,
            }
            return Ok(ids);
        }
        let rows = match prefilled {
            Prefilled::Cache(cache) => {
                let all: Vec<usize> = (0..newcomers.len()).collect();
                let attention = session.description.variant.attention;
                rows::split(&cache, attention, &masks(&newcomers), &all)?
            }
            Prefilled::Rows(rows) => rows,
        };
        if !self.put_in_free_slots(&rows)? {
            self.relayout(session, newcomers, rows)?;
            return Ok(ids);
        }
        let mut newcomers = newcomers.into_iter();
        for slot in self.slots.iter_mut().filter(|s| s.row.is_none()) {
            match newcomers.next() {
                Some(newcomer) => slot.row = newcomer.row,
                None => break,
            }
        }
        Ok(ids)
    }

    /// Puts the newcomers' `rows` into free slots of the running cache (setting their
    /// masks), when there are enough free slots and each fits there without moving the
    /// rows generating; false if not (and nothing changed).
    fn put_in_free_slots(&mut self, rows: &[RowCache]) -> Result<bool> {
        let cache = self.cache.as_mut().expect("a running batch has a cache");
        let width = cache.len();
        let free: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].row.is_none())
            .collect();
        // The columns' growth past the cache is checked before each step.
        let fits = rows.iter().all(|row| row.len() <= width);
        if free.len() < rows.len() || !fits {
            return Ok(false);
        }
        for (&i, row) in free.iter().zip(rows) {
            self.slots[i].mask = rows::put(cache, i, row)?;
        }
        Ok(true)
    }

    /// Picks every row's next token, frees the slots of the rows that are done, and
    /// decodes one step for the others. Returns the rows that finished. Where the graph
    /// carries the confidence head's pools, a row done with its last token unfed feeds it
    /// in one more step (its confidence then covers it) and leaves after that step.
    pub fn step(&mut self, session: &mut NeedleSession) -> Result<Vec<Finished>> {
        let max_len = session.config().max_seq_len();
        let closes = session.carries_confidence_pools();
        let mut finished = Vec::new();
        let mut fed = vec![None; self.slots.len()];
        for (slot, fed) in self.slots.iter_mut().zip(fed.iter_mut()) {
            let Some(row) = slot.row.as_mut() else {
                continue;
            };
            match row.advance(max_len) {
                Ok(Some(token)) => *fed = Some(token),
                Ok(None) if closes && row.last_unfed() => {
                    row.closing = true;
                    *fed = row.last_generated();
                }
                outcome => {
                    let row = slot.row.take().expect("a row");
                    finished.push(Finished {
                        id: row.id,
                        decoded: outcome.map(|_| row.finished()),
                    });
                }
            }
        }
        if self.is_empty() {
            self.slots.clear();
            self.cache = None;
            return Ok(finished);
        }
        // A full cache slides where the plan says so and it is wider than the window, else
        // it is laid out anew with more room (as is one whose slots are half free).
        let window = session.plan.sliding_window;
        let full = |c: &Cache| c.len() + 1 > c.capacity().unwrap_or(max_len);
        let can_slide = |c: &Cache| window.is_some_and(|w| c.len() > w);
        let cache = self.cache.as_ref().expect("a running batch has a cache");
        if self.live().len() * 2 <= self.slots.len() || (full(cache) && !can_slide(cache)) {
            self.compact(session)?;
            fed = self
                .slots
                .iter()
                .map(|s| s.row.as_ref().and_then(Row::last_generated))
                .collect();
        }
        let cache = self.cache.as_ref().expect("a running batch has a cache");
        if let Some(window) = window.filter(|_| full(cache) && can_slide(cache)) {
            self.slide(window)?;
        }
        let pad = i64::from(session.description.tokenizer.pad_id);
        let inputs = StepInputs {
            input_ids: fed.iter().map(|t| t.map_or(pad, i64::from)).collect(),
            attention_mask: self
                .slots
                .iter_mut()
                .zip(&fed)
                .flat_map(|(slot, token)| {
                    slot.mask.push(i64::from(token.is_some()));
                    slot.mask.iter().copied()
                })
                .collect(),
            position_ids: self
                .slots
                .iter()
                .map(|s| s.row.as_ref().map_or(0, |r| r.cached() as i64))
                .collect(),
            batch: self.slots.len(),
            heads: false,
            // One token a row: its logits are all there are.
            logits_to_keep: 0,
        };
        let cache = self.cache.take().expect("a running batch has a cache");
        let start = Instant::now();
        let step = session.step(inputs, cache)?;
        let secs = start.elapsed().as_secs_f64();
        let vocab = session.config().output_vocab();
        for (r, slot) in self.slots.iter_mut().enumerate() {
            let Some(row) = slot.row.as_mut() else {
                continue;
            };
            row.logits.clear();
            row.logits
                .extend_from_slice(&step.logits[r * vocab..(r + 1) * vocab]);
            row.confidence_logit = step.confidence_logit.as_ref().map(|c| c[r]);
            row.decode_tokens += 1;
            row.decode_secs += secs;
            if row.closing {
                let row = slot.row.take().expect("a row");
                finished.push(Finished {
                    id: row.id,
                    decoded: Ok(row.finished()),
                });
            }
        }
        self.cache = Some(step.cache);
        Ok(finished)
    }

    /// Slides the running cache down to `window` columns ([`slide`]): each row keeps its
    /// last `window` tokens (their count is its mask's ones, the fused graph's layout).
    fn slide(&mut self, window: usize) -> Result<()> {
        let cache = self.cache.as_mut().expect("a running batch has a cache");
        let counts: Vec<usize> = self
            .slots
            .iter()
            .map(|s| s.mask.iter().filter(|&&m| m == 1).count())
            .collect();
        let kept = slide::slide(cache, &counts, window)?;
        for (slot, kept) in self.slots.iter_mut().zip(kept) {
            slot.mask = padded_mask(kept, window);
        }
        Ok(())
    }

    /// The slots with a row generating.
    fn live(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].row.is_some())
            .collect()
    }

    /// Lays the cache out anew with only the rows generating.
    fn compact(&mut self, session: &NeedleSession) -> Result<()> {
        self.relayout(session, Vec::new(), Vec::new())
    }

    /// Lays the cache out anew: the rows generating, then `newcomers` (whose cache rows
    /// are `rows`).
    fn relayout(
        &mut self,
        session: &NeedleSession,
        newcomers: Vec<Slot<F>>,
        rows: Vec<RowCache>,
    ) -> Result<()> {
        let running = self.cache.take().expect("a running batch has a cache");
        let live = self.live();
        let attention = session.description.variant.attention;
        let mut parts = rows::split(&running, attention, &masks(&self.slots), &live)?;
        drop(running);
        parts.extend(rows);
        let mut slots = std::mem::take(&mut self.slots);
        self.slots = live.iter().map(|&i| take_slot(&mut slots[i])).collect();
        self.slots.extend(newcomers);
        self.rejoin(session, parts)
    }

    /// Puts `parts` (the rows of `self.slots`, in order) into one cache, with room for
    /// every row to finish (between two layouts all rows grow together, so the batch
    /// never gets wider than its widest row's prompt and budget), or where the cache
    /// slides, for the window and a prefill piece.
    fn rejoin(&mut self, session: &NeedleSession, parts: Vec<RowCache>) -> Result<()> {
        let width = rows::width(&parts);
        let capacity = session.plan.cache_room(width + 1, rows_budget(&self.slots));
        let zeroed = session.zeroed_cache(parts.len(), width, capacity)?;
        let (cache, masks) = rows::join(zeroed, &parts)?;
        for (slot, mask) in self.slots.iter_mut().zip(masks) {
            slot.mask = mask;
        }
        self.cache = Some(cache);
        Ok(())
    }
}

/// Room for every row of `slots` to finish: its prompt and all it may generate, for the
/// longest.
fn rows_budget<F>(slots: &[Slot<F>]) -> usize {
    slots
        .iter()
        .filter_map(|s| s.row.as_ref())
        .map(Row::budget)
        .max()
        .unwrap_or(0)
}

fn take_slot<F>(slot: &mut Slot<F>) -> Slot<F> {
    Slot {
        row: slot.row.take(),
        mask: std::mem::take(&mut slot.mask),
    }
}

fn masks<F>(slots: &[Slot<F>]) -> Vec<&[i64]> {
    slots.iter().map(|s| &s.mask[..]).collect()
}

/// A prompt's last position after its prefill: the logits its first token is picked from,
/// and the confidence head's logit over the prompt where the graph carries the head's
/// pools.
struct Last {
    logits: Vec<f32>,
    confidence_logit: Option<f32>,
}

impl Last {
    /// Row `r`'s last position, `at` its logits' offset in `step`.
    fn of(step: &StepOutput, r: usize, at: usize, vocab: usize) -> Last {
        Last {
            logits: step.logits[at..at + vocab].to_vec(),
            confidence_logit: step.confidence_logit.as_ref().map(|c| c[r]),
        }
    }
}

/// What [`prefill`] leaves: one cache of every prompt (right-padded), or, when the
/// prompts were run in several groups, each prompt's rows (which the caller puts where it
/// needs them, so that joining a running batch copies them once).
enum Prefilled {
    Cache(Cache),
    Rows(Vec<RowCache>),
}

/// Runs `prompts` from an empty cache (with room for `most_new` more tokens each), in
/// groups whose calls stay within the plan's `prefill_group_logits_bytes`; a lone prompt
/// after the longest of `prefixes` it continues, and then remembered there. Returns what
/// they left in the cache, each prompt's [`Last`] position and how many of its tokens were
/// taken from `prefixes` rather than run.
fn prefill(
    session: &mut NeedleSession,
    prompts: &[&[u32]],
    most_new: usize,
    prefixes: Option<&mut PrefixStore>,
) -> Result<(Prefilled, Vec<Last>, Vec<usize>)> {
    if let ([prompt], Some(prefixes)) = (prompts, prefixes) {
        if !session.is_accelerator() {
            let (cache, last, cached) = prefill_one(session, prompt, most_new, Some(prefixes))?;
            return Ok((Prefilled::Cache(cache), vec![last], vec![cached]));
        }
    }
    let row_bytes = 4 * session.config().output_vocab();
    let mut groups: Vec<&[&[u32]]> = Vec::new();
    let mut start = 0;
    for end in 1..=prompts.len() {
        let longest = prompts[start..end]
            .iter()
            .map(|p| p.len())
            .max()
            .unwrap_or(0);
        let fits = (end - start) * longest * row_bytes <= session.plan.prefill_group_logits_bytes;
        if !fits && end - start > 1 {
            groups.push(&prompts[start..end - 1]);
            start = end - 1;
        }
    }
    groups.push(&prompts[start..]);
    let none_cached = vec![0; prompts.len()];
    if let [group] = groups[..] {
        let (cache, lasts) = prefill_together(session, group, most_new)?;
        return Ok((Prefilled::Cache(cache), lasts, none_cached));
    }
    let attention = session.description.variant.attention;
    let mut parts = Vec::with_capacity(prompts.len());
    let mut lasts = Vec::with_capacity(prompts.len());
    for group in groups {
        let (cache, group_lasts) = prefill_together(session, group, most_new)?;
        let width = cache.len();
        let masks: Vec<Vec<i64>> = group.iter().map(|p| padded_mask(p.len(), width)).collect();
        let masks: Vec<&[i64]> = masks.iter().map(Vec::as_slice).collect();
        let all: Vec<usize> = (0..group.len()).collect();
        parts.extend(rows::split(&cache, attention, &masks, &all)?);
        lasts.extend(group_lasts);
    }
    Ok((Prefilled::Rows(parts), lasts, none_cached))
}

/// Runs `prompt` (with room for `most_new` more tokens) in the pieces the run plan says
/// ([`decode::prefill`]): after the cache of the longest prompt of `prefixes` it
/// continues, else from an empty cache; then remembers it in `prefixes`. Returns its
/// cache, [`Last`] position and how many of its tokens were not run.
fn prefill_one(
    session: &mut NeedleSession,
    prompt: &[u32],
    most_new: usize,
    mut prefixes: Option<&mut PrefixStore>,
) -> Result<(Cache, Last, usize)> {
    let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    let capacity = ids.len() + most_new;
    let continued = prefixes
        .as_deref_mut()
        .and_then(|p| p.longest_prefix(prompt));
    let (out, cached) = match continued {
        Some((cached, row)) => {
            // `forward` slides the row when its next piece does not fit.
            let room = session.plan.cache_room(row.len(), capacity);
            let zeroed = session.zeroed_cache(1, row.len(), room)?;
            let (mut cache, _) = rows::join(zeroed, std::slice::from_ref(row))?;
            cache.slid = cached - row.len();
            (
                decode::prefill_after(session, &ids[cached..], cache)?,
                cached,
            )
        }
        None => (decode::prefill(session, &ids, capacity)?, 0),
    };
    if let Some(prefixes) = prefixes {
        let attention = session.description.variant.attention;
        // Every column is the prompt's (its last tokens, where the cache slid).
        let mask = padded_mask(prompt.len(), out.cache.len());
        let mut row = rows::split(&out.cache, attention, &[&mask], &[0])?;
        prefixes.remember(prompt.to_vec(), row.pop().expect("one row"));
    }
    let vocab = session.config().output_vocab();
    let last = Last::of(&out, 0, out.logits.len() - vocab, vocab);
    Ok((out.cache, last, cached))
}

/// Runs `prompts` from an empty cache together (with room for `most_new` more tokens
/// each): one prompt in the pieces the run plan says ([`decode::prefill`]), several in
/// one call, padded on the right. Returns the cache and each prompt's [`Last`] position.
fn prefill_together(
    session: &mut NeedleSession,
    prompts: &[&[u32]],
    most_new: usize,
) -> Result<(Cache, Vec<Last>)> {
    let vocab = session.config().output_vocab();
    if let [prompt] = prompts {
        let (cache, last, _) = prefill_one(session, prompt, most_new, None)?;
        return Ok((cache, vec![last]));
    }
    let pad = i64::from(session.description.tokenizer.pad_id);
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let shortest = prompts.iter().map(|p| p.len()).min().unwrap_or(0);
    // Only each row's last token's logits are read: the positions from the shortest
    // row's last on (graphs that keep fewer give those; the others give every position).
    let inputs = StepInputs {
        logits_to_keep: longest + 1 - shortest,
        ..StepInputs::right_padded(prompts, pad)
    };
    let room = session.plan.cache_room(longest, longest + most_new);
    let cache = session.preallocated_cache(prompts.len(), room)?;
    let step = session.step(inputs, cache)?;
    let kept = step.logits.len() / (prompts.len() * vocab);
    let first_kept = longest - kept;
    let lasts = prompts
        .iter()
        .enumerate()
        .map(|(r, prompt)| {
            let at = (r * kept + prompt.len() - 1 - first_kept) * vocab;
            Last::of(&step, r, at, vocab)
        })
        .collect();
    Ok((step.cache, lasts))
}
