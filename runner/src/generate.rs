//! The one-shot API: one prompt prefilled, then one token per step through the KV cache
//! until a stop token, the token budget or a full context (the one-row case of
//! [`crate::batch::generate_batch`]).

use crate::batch::generate_batch;
use crate::decode::{Decoded, GenerateOptions, TokenFilter};
use crate::engine::Admission;
use crate::session::NeedleSession;
use anyhow::Result;

/// Generates after `prompt_ids` (batch 1; the prompt includes BOS if the caller wants it).
/// Stops at a stop token, after `max_new_tokens`, or when the model's `max_seq_len` is full:
/// like upstream `generate_cached`, a token is kept only if it still fits the context
/// (prompt + generated ≤ `max_seq_len`), so the last one kept could be fed back.
pub fn generate(
    session: &mut NeedleSession,
    prompt_ids: &[u32],
    opts: &GenerateOptions,
) -> Result<Decoded> {
    generate_filtered(session, prompt_ids, opts, None)
}

/// [`generate`] choosing each token among those `filter` allows: the one-row case of
/// [`crate::batch::generate_batch`].
pub fn generate_filtered(
    session: &mut NeedleSession,
    prompt_ids: &[u32],
    opts: &GenerateOptions,
    filter: Option<&mut dyn TokenFilter>,
) -> Result<Decoded> {
    let mut filter = filter;
    let mut runs = generate_batch(session, 1, 1, |_| {
        Ok(Admission {
            prompt: prompt_ids.to_vec(),
            opts: opts.clone(),
            filter: filter.take(),
        })
    })?;
    Ok(runs.remove(0))
}
