//! The HTTP side: `POST /v1/chat/completions` (whole or streamed as server-sent events),
//! `GET /v1/models[/{id}]`, `GET /metrics`, `GET /health`. A handler reads and checks its request, tokenizes the
//! prompt, compiles the answer's grammar when it has one, queues the job for the decoding
//! thread and turns what comes back into OpenAI's objects. Every refusal is OpenAI's error
//! object with a status saying whose fault it is.

use crate::answer::tool_prompt_ids;
use crate::constrain::ConstraintFactory;
use crate::decode::{GenerateOptions, Sampling};
use crate::prompt::{parse_answer, Answer};
use crate::provider::Provider;
use crate::serve::auth::{self, ApiKey};
use crate::serve::metrics::{self, Metrics};
use crate::serve::request::{self, ChatRequest};
use crate::serve::response::{self, Meta};
use crate::serve::scheduler::{Done, Event, Job, RowFilter};
use crate::serve::stop::{StopTexts, StopWatch};
use crate::stream::stable_text;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use exporter::tokenizer::NeedleTokenizer;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// What every handler shares.
pub struct Shared {
    pub jobs: SyncSender<Job>,
    pub tokenizer: Arc<NeedleTokenizer>,
    pub constraints: ConstraintFactory,
    pub stop_ids: Vec<u32>,
    pub model: String,
    pub provider: Provider,
    pub max_seq_len: usize,
    pub default_max_tokens: usize,
    pub queue: usize,
    pub timeout: Duration,
    pub completions: AtomicU64,
    /// When the server started (the model object's `created`).
    pub started: u64,
    pub metrics: Arc<Metrics>,
}

/// The routes, `/health` aside behind `api_key` when there is one, every answer counted.
pub fn router(shared: Arc<Shared>, max_body: usize, api_key: Option<ApiKey>) -> Router {
    let metrics = shared.metrics.clone();
    let mut app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/metrics", get(metrics_text))
        .route("/health", get(health))
        .fallback(|| async {
            refuse(
                StatusCode::NOT_FOUND,
                "no such endpoint (POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id}, \
                 GET /metrics, GET /health)",
                None,
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(shared);
    if let Some(key) = api_key {
        app = app.layer(middleware::from_fn_with_state(
            Arc::new(key),
            auth::require_key,
        ));
    }
    app.layer(middleware::from_fn_with_state(
        metrics,
        metrics::count_requests,
    ))
}

type AppState = State<Arc<Shared>>;

async fn health(State(s): AppState) -> Json<Value> {
    Json(json!({"status": "ok", "model": s.model, "provider": s.provider}))
}

async fn models(State(s): AppState) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&s)]}))
}

fn model_object(s: &Shared) -> Value {
    json!({"id": s.model, "object": "model", "created": s.started, "owned_by": "needle-onnx"})
}

/// `GET /v1/models/{id}`: the one model, or 404 `model_not_found` for any other name.
async fn model(State(s): AppState, Path(id): Path<String>) -> Response {
    match id == s.model {
        true => Json(model_object(&s)).into_response(),
        false => unknown_model(&s, &id),
    }
}

async fn metrics_text(State(s): AppState) -> Response {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], s.metrics.render()).into_response()
}

/// OpenAI's and vLLM's answer to a model the server does not have. Answering as the one
/// model whatever the name (llama.cpp's server) would hide a client configured for another
/// server; a request that names no model gets the one model.
fn unknown_model(s: &Shared, name: &str) -> Response {
    let message = format!(
        "The model `{name}` does not exist; this server serves `{}`",
        s.model
    );
    let mut body = response::error(&message, "invalid_request_error", Some("model"));
    body["error"]["code"] = "model_not_found".into();
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// The refusal of a request body whose `model` is not the one served; `None` when it is
/// (or says none).
fn wrong_model(s: &Shared, body: &Value) -> Option<Response> {
    match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if *name == s.model => None,
        Some(Value::String(name)) => Some(unknown_model(s, name)),
        Some(_) => Some(refuse(
            StatusCode::BAD_REQUEST,
            "model must be a string",
            Some("model"),
        )),
    }
}

fn refuse(status: StatusCode, message: &str, param: Option<&str>) -> Response {
    let kind = match status {
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        s if s.is_server_error() => "server_error",
        _ => "invalid_request_error",
    };
    (status, Json(response::error(message, kind, param))).into_response()
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn chat_completions(State(s): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let message = format!("cannot read the request body: {}", rejection.body_text());
            return refuse(rejection.status(), &message, None);
        }
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                &format!("the request body is not JSON: {e}"),
                None,
            )
        }
    };
    if let Some(refusal) = wrong_model(&s, &value) {
        return refusal;
    }
    let request = match request::parse(&value) {
        Ok(request) => request,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e.message, e.param),
    };
    let (job, events) = match prepare(&s, &request) {
        Ok(prepared) => prepared,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e, None),
    };
    // Counted before it is sent, so that the decoder never takes out what was not counted in.
    s.metrics.queued();
    let sent = s.jobs.try_send(job);
    if sent.is_err() {
        s.metrics.dequeued();
    }
    match sent {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            let message = format!(
                "the server is busy: {} requests are queued; retry later",
                s.queue
            );
            return refuse(StatusCode::TOO_MANY_REQUESTS, &message, None);
        }
        Err(TrySendError::Disconnected(_)) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
                None,
            )
        }
    }
    let n = s.completions.fetch_add(1, Ordering::Relaxed);
    let id = format!("chatcmpl-{:x}{n:06x}", now());
    let deadline = tokio::time::Instant::now() + s.timeout;
    match request.stream {
        true => stream(s, id, &request, events, deadline, arrived).into_response(),
        false => whole(&s, &id, &request.stop, events, deadline, arrived).await,
    }
}

/// The job of `request` and the channel its events come back on; or why it cannot run.
fn prepare(s: &Shared, request: &ChatRequest) -> Result<(Job, UnboundedReceiver<Event>), String> {
    let tools = Value::Array(request.tools.clone());
    let prompt = tool_prompt_ids(
        &s.tokenizer,
        &tools,
        &request.query,
        request.system.as_deref(),
    );
    if prompt.len() >= s.max_seq_len {
        return Err(format!(
            "the prompt has {} tokens; the model's context is {} tokens",
            prompt.len(),
            s.max_seq_len
        ));
    }
    let max_new_tokens = request.max_tokens.unwrap_or(s.default_max_tokens);
    let filter: Option<RowFilter> = match request.constrained() {
        true => {
            let budget = max_new_tokens.min(s.max_seq_len - prompt.len());
            let callable = Value::Array(request.callable_tools());
            let constraint = s
                .constraints
                .for_tools(&callable, request.call_count(), budget)
                .map_err(|e| format!("{e:#}"))?;
            Some(Box::new(constraint))
        }
        false => None,
    };
    let sampling = match request.temperature {
        t if t > 0.0 => Sampling::Temperature {
            temperature: t,
            seed: request.seed,
        },
        _ => Sampling::Greedy,
    };
    let (events, receiver) = unbounded_channel();
    let job = Job {
        prompt,
        opts: GenerateOptions {
            max_new_tokens,
            stop_ids: s.stop_ids.clone(),
            sampling,
        },
        filter,
        stop: (!request.stop.is_empty())
            .then(|| StopWatch::new(s.tokenizer.clone(), request.stop.clone())),
        events,
        queued_at: Instant::now(),
    };
    Ok((job, receiver))
}

fn timed_out(s: &Shared) -> String {
    format!(
        "the request did not finish within {} s (--request-timeout)",
        s.timeout.as_secs_f64()
    )
}

/// The answer of a finished generation: its decoded text, cut at the first stop sequence.
fn final_answer(s: &Shared, done: &Done, stops: &StopTexts) -> Answer {
    let text = s.tokenizer.decode(&done.decoded.generated_ids);
    parse_answer(stops.cut(&text).0)
}

/// A non-streamed answer: waits for the whole generation.
async fn whole(
    s: &Shared,
    id: &str,
    stops: &StopTexts,
    mut events: UnboundedReceiver<Event>,
    deadline: tokio::time::Instant,
    arrived: Instant,
) -> Response {
    let mut first = true;
    let outcome = tokio::time::timeout_at(deadline, async {
        loop {
            match events.recv().await {
                Some(Event::Token(_)) => {
                    if std::mem::take(&mut first) {
                        s.metrics.first_token(arrived.elapsed());
                    }
                }
                Some(Event::Done(done)) => return Ok(done),
                Some(Event::Failed(why)) => return Err(why),
                None => return Err("the decoder stopped".to_string()),
            }
        }
    })
    .await;
    s.metrics.request_done(arrived.elapsed());
    match outcome {
        Ok(Ok(done)) => {
            let answer = final_answer(s, &done, stops);
            let meta = Meta {
                id,
                created: now(),
                model: &s.model,
            };
            Json(response::completion(&meta, &answer, &done, s.provider)).into_response()
        }
        Ok(Err(why)) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &why, None),
        Err(_) => refuse(StatusCode::GATEWAY_TIMEOUT, &timed_out(s), None),
    }
}

/// A streamed answer: `reasoning_content` and `content` deltas as the text grows (each
/// trimmed as the whole answer's is, so they add up to it), the calls once their list is
/// complete, then the `finish_reason` chunk with Needle's extras, the usage chunk if asked
/// for, and `[DONE]`.
fn stream(
    s: Arc<Shared>,
    id: String,
    request: &ChatRequest,
    events: UnboundedReceiver<Event>,
    deadline: tokio::time::Instant,
    arrived: Instant,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let created = now();
    let first = response::chunk(
        &Meta {
            id: &id,
            created,
            model: &s.model,
        },
        json!({"role": "assistant", "content": ""}),
        None,
    );
    let state = Streamer {
        s,
        id,
        created,
        include_usage: request.include_usage,
        stops: request.stop.clone(),
        events,
        deadline,
        ids: Vec::new(),
        sent: Answer {
            reasoning: String::new(),
            calls: Ok(Value::Null),
            text: String::new(),
        },
        pending: VecDeque::from([first.to_string()]),
        finished: false,
        arrived,
        first_token: true,
    };
    let events = futures_util::stream::unfold(state, |mut state| async move {
        let data = state.next().await?;
        Some((Ok(SseEvent::default().data(data)), state))
    });
    Sse::new(events)
}

struct Streamer {
    s: Arc<Shared>,
    id: String,
    created: u64,
    include_usage: bool,
    stops: StopTexts,
    events: UnboundedReceiver<Event>,
    deadline: tokio::time::Instant,
    ids: Vec<u32>,
    /// The reasoning and text sent so far.
    sent: Answer,
    pending: VecDeque<String>,
    finished: bool,
    arrived: Instant,
    /// Whether the first token is still to come.
    first_token: bool,
}

impl Streamer {
    fn meta(&self) -> Meta<'_> {
        Meta {
            id: &self.id,
            created: self.created,
            model: &self.s.model,
        }
    }

    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(data) = self.pending.pop_front() {
                return Some(data);
            }
            if self.finished {
                return None;
            }
            match tokio::time::timeout_at(self.deadline, self.events.recv()).await {
                Ok(Some(Event::Token(token))) => {
                    if std::mem::take(&mut self.first_token) {
                        self.s.metrics.first_token(self.arrived.elapsed());
                    }
                    self.ids.push(token);
                    let text = stable_text(&self.s.tokenizer, &self.ids);
                    let partial = parse_answer(self.stops.shown(&text));
                    self.send_growth(&partial);
                }
                Ok(Some(Event::Done(done))) => {
                    let answer = final_answer(&self.s, &done, &self.stops);
                    self.send_growth(&answer);
                    let calls = response::tool_call_deltas(&answer, &self.id);
                    let mut last = response::chunk(
                        &self.meta(),
                        json!({}),
                        Some(response::finish_reason(&answer, &done)),
                    );
                    last["needle"] = response::needle_extras(&answer, &done, self.s.provider);
                    let mut out: Vec<String> = calls
                        .into_iter()
                        .map(|delta| response::chunk(&self.meta(), delta, None).to_string())
                        .collect();
                    out.push(last.to_string());
                    if self.include_usage {
                        let mut usage = response::chunk(&self.meta(), json!({}), None);
                        usage["choices"] = json!([]);
                        usage["usage"] = response::usage(&done);
                        out.push(usage.to_string());
                    }
                    self.pending.extend(out);
                    self.end();
                }
                Ok(Some(Event::Failed(why))) => self.fail(&why),
                Ok(None) => self.fail("the decoder stopped"),
                Err(_) => {
                    let why = timed_out(&self.s);
                    self.fail(&why);
                }
            }
        }
    }

    /// Sends what the reasoning and the text gained over what was sent.
    fn send_growth(&mut self, now: &Answer) {
        let mut delta = serde_json::Map::new();
        for (key, was, is) in [
            (
                "reasoning_content",
                &mut self.sent.reasoning,
                &now.reasoning,
            ),
            ("content", &mut self.sent.text, &now.text),
        ] {
            if is.len() > was.len() && is.starts_with(was.as_str()) {
                delta.insert(key.into(), Value::String(is[was.len()..].to_string()));
                *was = is.clone();
            }
        }
        if !delta.is_empty() {
            let chunk = response::chunk(&self.meta(), Value::Object(delta), None);
            self.pending.push_back(chunk.to_string());
        }
    }

    fn fail(&mut self, why: &str) {
        self.pending
            .push_back(response::error(why, "server_error", None).to_string());
        self.end();
    }

    fn end(&mut self) {
        self.s.metrics.request_done(self.arrived.elapsed());
        self.pending.push_back("[DONE]".to_string());
        self.finished = true;
    }
}
