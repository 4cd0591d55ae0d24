//! `POST /v1/chat/completions`: reads and checks the request, tokenizes the prompt,
//! compiles the answer's grammar when it has one, queues one row per choice (`n`) for the
//! decoding thread, and answers with every choice whole or streamed ([`chat_stream`]).

use crate::answer::tool_conversation_ids;
use crate::decode::{GenerateOptions, Sampling};
use crate::prompt::answers_tool_results;
use crate::serve::chat_stream;
use crate::serve::models::wrong_model;
use crate::serve::request::{self, ChatRequest, Invalid};
use crate::serve::response::{self, Choice, Meta};
use crate::serve::scheduler::{Done, Event, Job, RowFilter};
use crate::serve::shared::{
    final_answer, json_body, now, queue_jobs, refuse, timed_out, AppState, ChoiceEvents, Shared,
};
use crate::serve::stop::StopWatch;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc::unbounded_channel;

pub async fn completions(State(s): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    let (_, request, events) = match admit(&s, body, request::parse) {
        Ok(admitted) => admitted,
        Err(refusal) => return *refusal,
    };
    let id = completion_id(&s, "chatcmpl-");
    let deadline = tokio::time::Instant::now() + s.timeout;
    match request.stream {
        true => chat_stream::stream(s, id, &request, events, deadline, arrived).into_response(),
        false => match collect(&s, &request, events, deadline, arrived).await {
            Ok(choices) => {
                let meta = Meta {
                    id: &id,
                    created: now(),
                    model: &s.model,
                };
                Json(response::completion(&meta, &choices, s.provider)).into_response()
            }
            Err(refusal) => *refusal,
        },
    }
}

/// A new completion's id: `prefix` (OpenAI's: `chatcmpl-`, `resp_`), the time and a counter.
pub fn completion_id(s: &Shared, prefix: &str) -> String {
    let n = s.completions.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:06x}", now())
}

/// What both endpoints do before they answer: the body read as JSON and by `parse` (a chat
/// or a Responses request), its model name checked, its rows prepared and queued; returns
/// the body, the request and its rows' events. A refusal is the response to send.
pub fn admit(
    s: &Shared,
    body: Result<Bytes, BytesRejection>,
    parse: fn(&Value) -> Result<ChatRequest, Invalid>,
) -> Result<(Value, ChatRequest, ChoiceEvents), Box<Response>> {
    let value = json_body(body)?;
    if let Some(refusal) = wrong_model(s, &value) {
        return Err(Box::new(refusal));
    }
    let bad_request = |e: Invalid| Box::new(refuse(StatusCode::BAD_REQUEST, &e.message, e.param));
    let request = parse(&value).map_err(bad_request)?;
    let (jobs, events) = prepare(s, &request).map_err(bad_request)?;
    queue_jobs(s, jobs)?;
    Ok((value, request, events))
}

/// The rows of `request` (one per choice) and the channel their events come back on; or
/// why this server cannot run it.
pub fn prepare(s: &Shared, request: &ChatRequest) -> Result<(Vec<Job>, ChoiceEvents), Invalid> {
    if request.n > s.max_batch {
        return Err(Invalid {
            message: format!(
                "n is {}; this server decodes at most {} rows together (--max-batch)",
                request.n, s.max_batch
            ),
            param: Some("n"),
        });
    }
    let tools = Value::Array(request.tools.clone());
    let prompt = tool_conversation_ids(
        &s.tokenizer,
        &tools,
        &request.query,
        request.system.as_deref(),
        &request.turns,
    );
    if prompt.len() >= s.max_seq_len {
        return Err(Invalid {
            message: format!(
                "the prompt has {} tokens; the model's context is {} tokens",
                prompt.len(),
                s.max_seq_len
            ),
            param: None,
        });
    }
    let max_new_tokens = request.max_tokens.unwrap_or(s.default_max_tokens);
    let (events, receiver) = unbounded_channel();
    let mut jobs = Vec::with_capacity(request.n);
    // Every answer is decoded under the declared tools' grammar (see request.rs).
    let budget = max_new_tokens.min(s.max_seq_len - prompt.len());
    let callable = Value::Array(request.callable_tools());
    for choice in 0..request.n {
        // Each row's grammar state is its own.
        let constraint = s
            .constraints
            .for_tools(
                &callable,
                request.call_count(),
                answers_tool_results(&request.turns),
                budget,
            )
            .map_err(|e| Invalid {
                message: format!("{e:#}"),
                param: None,
            })?;
        let filter: Option<RowFilter> = Some(Box::new(constraint));
        // Choice i samples with seed + i: n answers, each the one a request with that seed gets.
        let sampling = match request.temperature {
            t if t > 0.0 => Sampling::Temperature {
                temperature: t,
                seed: request.seed.wrapping_add(choice as u64),
            },
            _ => Sampling::Greedy,
        };
        jobs.push(Job {
            prompt: prompt.clone(),
            opts: GenerateOptions {
                max_new_tokens,
                stop_ids: s.stop_ids.clone(),
                sampling,
            },
            filter,
            stop: (!request.stop.is_empty())
                .then(|| StopWatch::new(s.tokenizer.clone(), request.stop.clone())),
            choice,
            top_logprobs: request.top_logprobs,
            events: events.clone(),
            queued_at: Instant::now(),
        });
    }
    Ok((jobs, receiver))
}

/// Waits for every choice of `request`; them in order, or the refusal (500 when decoding
/// failed, 504 past the deadline).
pub async fn collect(
    s: &Shared,
    request: &ChatRequest,
    mut events: ChoiceEvents,
    deadline: tokio::time::Instant,
    arrived: Instant,
) -> Result<Vec<Choice>, Box<Response>> {
    let mut first_token = true;
    let mut dones: Vec<Option<Box<Done>>> = (0..request.n).map(|_| None).collect();
    let mut logprobs: Vec<Vec<Value>> = vec![Vec::new(); request.n];
    let outcome = tokio::time::timeout_at(deadline, async {
        let mut left = request.n;
        while left > 0 {
            match events.recv().await {
                Some((choice, Event::Token(sampled))) => {
                    if std::mem::take(&mut first_token) {
                        s.metrics.first_token(arrived.elapsed());
                    }
                    if sampled.logprobs.is_some() {
                        logprobs[choice].push(response::logprob_entry(&s.token_bytes, &sampled));
                    }
                }
                Some((choice, Event::Done(done))) => {
                    dones[choice] = Some(done);
                    left -= 1;
                }
                Some((_, Event::Failed(why))) => return Err(why),
                None => return Err("the decoder stopped".to_string()),
            }
        }
        Ok(())
    })
    .await;
    s.metrics.request_done(arrived.elapsed());
    match outcome {
        Ok(Ok(())) => Ok(dones
            .into_iter()
            .zip(logprobs)
            .map(|(done, logprobs)| {
                let done = done.expect("every choice is done");
                Choice {
                    answer: final_answer(s, &done, &request.stop, request.form),
                    done,
                    logprobs: request.top_logprobs.map(|_| logprobs),
                }
            })
            .collect()),
        Ok(Err(why)) => Err(Box::new(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            &why,
            None,
        ))),
        Err(_) => Err(Box::new(refuse(
            StatusCode::GATEWAY_TIMEOUT,
            &timed_out(s),
            None,
        ))),
    }
}
