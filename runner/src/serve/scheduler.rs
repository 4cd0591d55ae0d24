//! The thread that owns the session and decodes every request: continuous batching
//! ([`Engine`]). A request waits in a bounded queue, joins the running batch at the next
//! step boundary while there is room, sends each token it generates back to its handler,
//! and leaves the batch when done. A request whose handler is gone (client disconnected,
//! timed out) fails its next token and leaves too.

use crate::answer::run_confidence;
use crate::decode::{Decoded, GenerateOptions, TokenFilter};
use crate::engine::{Admission, Engine, RowId};
use crate::serve::logprobs::{Distribution, TokenLogprobs};
use crate::serve::metrics::Metrics;
use crate::serve::stop::StopWatch;
use crate::session::NeedleSession;
use anyhow::{anyhow, Result};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// The filter a row decodes under, owned by the decoding thread.
pub type RowFilter = Box<dyn TokenFilter + Send>;

/// A request to decode.
pub struct Job {
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    /// The constraint the answer is decoded under, if any.
    pub filter: Option<RowFilter>,
    /// Ends the row at the request's stop sequences, if it has any.
    pub stop: Option<StopWatch>,
    /// Which of the request's choices (`n`) this row is; its events say so.
    pub choice: usize,
    /// Report each token's log-probability, with this many most likely alternatives.
    pub top_logprobs: Option<usize>,
    pub events: Events,
    pub queued_at: Instant,
}

/// Where a request's rows send their events, each with its choice's index.
pub type Events = UnboundedSender<(usize, Event)>;

/// A token a row generated.
#[derive(Debug)]
pub struct Sampled {
    pub id: u32,
    /// When the request asked for them.
    pub logprobs: Option<TokenLogprobs>,
}

/// What a request hears back.
#[derive(Debug)]
pub enum Event {
    /// A token it generated, in order.
    Token(Sampled),
    /// It is done.
    Done(Box<Done>),
    /// It failed: why.
    Failed(String),
}

#[derive(Debug)]
pub struct Done {
    pub decoded: Decoded,
    /// Seconds it waited in the queue before its prefill.
    pub queue_secs: f64,
    /// See [`crate::answer::ToolResponse::confidence`].
    pub confidence: Option<f64>,
}

/// Sends each accepted token (with its log-probabilities, from the logits left after the
/// constraint's mask) to the request's handler; fails (so the row leaves the batch) once
/// the handler is gone.
struct Notify {
    inner: Option<RowFilter>,
    stop: Option<StopWatch>,
    choice: usize,
    top_logprobs: Option<usize>,
    /// The distribution the next token is picked from, when log-probabilities are asked for.
    next: Option<Distribution>,
    events: Events,
}

impl TokenFilter for Notify {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        if let Some(inner) = self.inner.as_mut() {
            inner.mask(logits)?;
        }
        if self.top_logprobs.is_some() {
            self.next = Some(Distribution::of(logits));
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        if let Some(inner) = self.inner.as_mut() {
            inner.accept(token)?;
        }
        if let Some(stop) = self.stop.as_mut() {
            stop.accept(token)?;
        }
        let logprobs = match (self.next.take(), self.top_logprobs) {
            (Some(d), Some(k)) => Some(d.picked(token, k)),
            _ => None,
        };
        let sampled = Sampled {
            id: token,
            logprobs,
        };
        self.events
            .send((self.choice, Event::Token(sampled)))
            .map_err(|_| anyhow!("the request was abandoned"))
    }

    fn complete(&self) -> bool {
        self.stop.as_ref().is_some_and(StopWatch::complete)
    }

    fn ran_on(&self) -> bool {
        self.inner.as_ref().is_some_and(|f| f.ran_on())
    }
}

struct Running {
    events: Events,
    choice: usize,
    prompt: Vec<u32>,
    queue_secs: f64,
}

/// Decodes the jobs of `jobs` until every sender is gone and the last one is done, at
/// most `max_batch` at once, a lone newcomer continuing one of the last `prefixes`
/// prompts from its cache.
pub fn run(
    mut session: NeedleSession,
    jobs: Receiver<Job>,
    max_batch: usize,
    prefixes: usize,
    metrics: &Metrics,
) {
    let mut engine: Engine<Notify> = Engine::with_prefix_reuse(prefixes);
    let mut running: HashMap<RowId, Running> = HashMap::new();
    let mut open = true;
    loop {
        let mut joining = Vec::new();
        if engine.is_empty() {
            match jobs.recv() {
                Ok(job) => {
                    metrics.dequeued();
                    joining.push(job)
                }
                Err(_) => return,
            }
        }
        while open && engine.len() + joining.len() < max_batch {
            match jobs.try_recv() {
                Ok(job) => {
                    metrics.dequeued();
                    joining.push(job)
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        joining.retain(|job| !job.events.is_closed());
        if !joining.is_empty() {
            admit(&mut session, &mut engine, &mut running, joining);
            metrics.batch_rows(engine.len());
        }
        if engine.is_empty() {
            if !open {
                return;
            }
            continue;
        }
        match engine.step(&mut session) {
            Ok(finished) => {
                for f in finished {
                    let Some(row) = running.remove(&f.id) else {
                        continue;
                    };
                    let event = match f.decoded {
                        Ok(decoded) => {
                            let d = &decoded;
                            metrics.tokens(
                                d.prefill_tokens,
                                d.cached_prompt_tokens,
                                d.generated_ids.len(),
                            );
                            done(&mut session, &row, decoded)
                        }
                        Err(e) => Event::Failed(format!("{e:#}")),
                    };
                    let _ = row.events.send((row.choice, event));
                }
            }
            Err(e) => {
                // onnxruntime failed: every running request fails with it, the server goes on.
                for (_, row) in running.drain() {
                    let failed = Event::Failed(format!("decoding failed: {e:#}"));
                    let _ = row.events.send((row.choice, failed));
                }
                engine.clear();
            }
        }
        metrics.batch_rows(engine.len());
    }
}

fn admit(
    session: &mut NeedleSession,
    engine: &mut Engine<Notify>,
    running: &mut HashMap<RowId, Running>,
    joining: Vec<Job>,
) {
    let mut rows = Vec::with_capacity(joining.len());
    let admissions = joining
        .into_iter()
        .map(|job| {
            rows.push(Running {
                events: job.events.clone(),
                choice: job.choice,
                prompt: job.prompt.clone(),
                queue_secs: job.queued_at.elapsed().as_secs_f64(),
            });
            Admission {
                prompt: job.prompt,
                opts: job.opts,
                filter: Some(Notify {
                    inner: job.filter,
                    stop: job.stop,
                    choice: job.choice,
                    top_logprobs: job.top_logprobs,
                    next: None,
                    events: job.events,
                }),
            }
        })
        .collect();
    match engine.admit(session, admissions) {
        Ok(ids) => running.extend(ids.into_iter().zip(rows)),
        Err(e) => {
            // Prompts are checked before they are queued, so this is onnxruntime failing;
            // the batch may be half rebuilt, so every request fails and decoding restarts.
            let failed = rows.into_iter().chain(running.drain().map(|(_, row)| row));
            for row in failed {
                let failed = Event::Failed(format!("prefill failed: {e:#}"));
                let _ = row.events.send((row.choice, failed));
            }
            engine.clear();
        }
    }
}

fn done(session: &mut NeedleSession, row: &Running, decoded: Decoded) -> Event {
    match run_confidence(session, &row.prompt, &decoded) {
        Ok(confidence) => Event::Done(Box::new(Done {
            decoded,
            queue_secs: row.queue_secs,
            confidence,
        })),
        Err(e) => Event::Failed(format!("the confidence head failed: {e:#}")),
    }
}
