//! Many prompts generated through one running batch (`needle-run --batch`): at most
//! `max_rows` rows decode together, and whenever rows are done the next prompts join the
//! [`Engine`] in their place, so the batch stays full until the prompts run out. One
//! prompt is [`crate::generate::generate_filtered`]'s single run; each row stops, samples
//! and is constrained exactly as its single run.

use crate::decode::{Decoded, TokenFilter};
use crate::engine::{Admission, Engine, RowId};
use crate::session::NeedleSession;
use anyhow::{anyhow, Result};
use std::collections::HashMap;

/// Generates after `count` prompts, `max_rows` at a time; `admission(i)` makes prompt
/// `i` (with BOS if the caller wants it), its options and filter when its row joins, in
/// order. Each run's decode time is that of the steps its row was in. Returns them
/// in the prompts' order.
pub fn generate_batch<F: TokenFilter>(
    session: &mut NeedleSession,
    count: usize,
    max_rows: usize,
    mut admission: impl FnMut(usize) -> Result<Admission<F>>,
) -> Result<Vec<Decoded>> {
    // The plan's limit (the accelerator graphs: one row a call) caps what was asked.
    let max_rows = session
        .plan
        .max_rows
        .map_or(max_rows, |rows| max_rows.min(rows));
    let mut engine = Engine::default();
    let mut next = 0;
    let mut index_of: HashMap<RowId, usize> = HashMap::new();
    let mut done: Vec<Option<Decoded>> = (0..count).map(|_| None).collect();
    loop {
        let joining = (next..count).take(max_rows.max(1) - engine.len());
        let indices: Vec<usize> = joining.collect();
        let admissions = indices
            .iter()
            .map(|&i| admission(i))
            .collect::<Result<Vec<_>>>()?;
        next += indices.len();
        let ids = engine.admit(session, admissions)?;
        index_of.extend(ids.into_iter().zip(indices));
        if engine.is_empty() {
            break;
        }
        for finished in engine.step(session)? {
            done[index_of[&finished.id]] = Some(finished.decoded?);
        }
    }
    done.into_iter()
        .map(|g| g.ok_or_else(|| anyhow!("a prompt of the batch was never generated")))
        .collect()
}
