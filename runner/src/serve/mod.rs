//! `needle-run serve`: an OpenAI-compatible chat-completions endpoint with tools, so the
//! OpenAI SDKs and agent frameworks can use a Needle model unchanged. Requests are decoded
//! together by continuous batching on one thread that owns the session
//! ([`scheduler`]); the HTTP side ([`http`]) runs on tokio with axum. SIGTERM or Ctrl-C
//! stops accepting connections, lets the requests in flight finish, then exits.

pub mod auth;
pub mod call_stream;
pub mod chat;
pub mod chat_stream;
pub mod http;
pub mod logprobs;
pub mod metrics;
pub mod models;
pub mod request;
pub mod response;
pub mod responses;
pub mod responses_object;
pub mod responses_request;
pub mod responses_stream;
pub mod scheduler;
pub mod shared;
pub mod stop;

use crate::answer::tool_stop_ids;
use crate::constrain::ConstraintFactory;
use crate::load::LoadedModel;
use anyhow::{anyhow, Context, Result};
use auth::ApiKey;
use metrics::Metrics;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// The name `/v1/models` lists and answers carry.
    pub model_name: String,
    /// Rows decoded together.
    pub max_batch: usize,
    /// Prompts remembered with their cache, so that a conversation coming back prefills
    /// only what it added.
    pub prefix_cache: usize,
    /// Requests waiting for a row; more are answered 429.
    pub queue: usize,
    /// Largest request body in bytes; larger ones are answered 413.
    pub max_body: usize,
    /// A request not done by then is answered 504 (and its row leaves the batch).
    pub timeout: Duration,
    /// `max_tokens` when a request does not say.
    pub default_max_tokens: usize,
    /// The key every route but `/health` requires (`Authorization: Bearer KEY`).
    pub api_key: Option<ApiKey>,
}

/// Serves `model` until SIGTERM or Ctrl-C. Says where on stderr once it listens.
pub fn serve(model: LoadedModel, opts: &ServeOptions) -> Result<()> {
    let LoadedModel {
        session, tokenizer, ..
    } = model;
    // The plan's limit (the accelerator graphs: one row a call) caps what was asked.
    let max_batch = session
        .plan
        .max_rows
        .map_or(opts.max_batch, |rows| opts.max_batch.min(rows));
    if max_batch < opts.max_batch {
        eprintln!(
            "needle-run: the accelerator graphs take one row a call: requests are decoded one \
             after another (--max-batch {max_batch})"
        );
    }
    let (jobs, queue) = std::sync::mpsc::sync_channel(opts.queue);
    let metrics = Arc::new(Metrics::new(max_batch));
    let shared = Arc::new(shared::Shared {
        jobs,
        constraints: ConstraintFactory::new(&tokenizer)?,
        stop_ids: tool_stop_ids(&tokenizer)?,
        token_bytes: tokenizer.text_bytes(),
        tokenizer: Arc::new(tokenizer),
        model: opts.model_name.clone(),
        provider: session.provider(),
        max_seq_len: session.config().max_seq_len(),
        default_max_tokens: opts.default_max_tokens,
        queue: opts.queue,
        timeout: opts.timeout,
        completions: AtomicU64::new(0),
        started: shared::now(),
        max_batch,
        metrics: metrics.clone(),
    });
    let provider = session.provider();
    let decoder = std::thread::Builder::new()
        .name("needle-decode".into())
        .spawn({
            let prefixes = opts.prefix_cache;
            move || scheduler::run(session, queue, max_batch, prefixes, &metrics)
        })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if !opts.addr.ip().is_loopback() && opts.api_key.is_none() {
        eprintln!(
            "needle-run: warning: --host {} is reachable beyond this machine and no --api-key (or NEEDLE_API_KEY) is set: anyone who reaches it can use the model",
            opts.addr.ip()
        );
    }
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .with_context(|| format!("cannot listen on {}", opts.addr))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "needle-run: serving {} on http://{addr}/v1 ({provider}); SIGTERM or Ctrl-C stops it",
            opts.model_name
        );
        let app = http::router(shared, opts.max_body, opts.api_key.clone());
        axum::serve(listener, app)
            .with_graceful_shutdown(stop_signal())
            .await
            .context("the server failed")
    })?;
    // Every handler (and its job sender) is gone: the decoder finishes and returns.
    decoder
        .join()
        .map_err(|_| anyhow!("the decoding thread panicked"))?;
    eprintln!("needle-run: stopped");
    Ok(())
}

async fn stop_signal() {
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate() => {}
    }
    eprintln!("needle-run: stopping: finishing the requests in flight");
}

/// SIGTERM, how service managers and container runtimes stop a process.
#[cfg(unix)]
async fn terminate() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut sigterm) => {
            sigterm.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn terminate() {
    std::future::pending().await
}
