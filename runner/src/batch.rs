//! Many prompts generated together through one batch (`needle-run --batch`): every row is
//! admitted to the [`Engine`] at once and decoded until the last one is done; a row that
//! is done leaves the batch. One prompt is [`crate::generate::generate_filtered`]'s single
//! run; each row of a batch stops, samples and is constrained exactly as its single run.

use crate::engine::{Admission, Engine};
use crate::generate::{GenerateOptions, Generation, TokenFilter};
use crate::session::NeedleSession;
use anyhow::Result;

/// Generates after each of `prompts` (each with BOS if the caller wants it); `filters[r]`
/// restricts row `r`. Each generation's decode time is that of the steps its row was in.
pub fn generate_batch(
    session: &mut NeedleSession,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    filters: Vec<Option<&mut dyn TokenFilter>>,
) -> Result<Vec<Generation>> {
    let mut engine = Engine::default();
    let admissions = prompts
        .iter()
        .zip(filters)
        .map(|(prompt, filter)| Admission {
            prompt: prompt.clone(),
            opts: opts.clone(),
            filter,
        })
        .collect();
    let ids = engine.admit(session, admissions)?;
    let mut done = Vec::with_capacity(ids.len());
    while !engine.is_empty() {
        done.extend(engine.step(session)?);
    }
    ids.iter()
        .map(|id| {
            let at = done
                .iter()
                .position(|f| f.id == *id)
                .expect("every row finishes");
            done.swap_remove(at).generation
        })
        .collect()
}
