//! What every handler shares: the server's state, reading a request body, and answering
//! a refusal with OpenAI's error object and a status saying whose fault it is.

use crate::constrain::ConstraintFactory;
use crate::prompt::{parse_answer, Answer};
use crate::provider::Provider;
use crate::serve::call_stream::partial_calls;
use crate::serve::metrics::Metrics;
use crate::serve::request::AnswerForm;
use crate::serve::response;
use crate::serve::scheduler::{Done, Event, Job};
use crate::serve::stop::StopTexts;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use exporter::tokenizer::NeedleTokenizer;
use serde_json::Value;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// What every handler shares.
pub struct Shared {
    pub jobs: SyncSender<Job>,
    pub tokenizer: Arc<NeedleTokenizer>,
    /// Each id's bytes in a text (`logprobs` entries' `token` and `bytes`).
    pub token_bytes: Vec<Option<Vec<u8>>>,
    pub constraints: ConstraintFactory,
    pub stop_ids: Vec<u32>,
    pub model: String,
    pub provider: Provider,
    pub max_seq_len: usize,
    pub max_batch: usize,
    pub default_max_tokens: usize,
    pub queue: usize,
    pub timeout: Duration,
    pub completions: AtomicU64,
    /// When the server started (the model object's `created`).
    pub started: u64,
    pub metrics: Arc<Metrics>,
}

pub type AppState = State<Arc<Shared>>;

/// OpenAI's error object with `status`; the error `type` follows from the status.
pub fn refuse(status: StatusCode, message: &str, param: Option<&str>) -> Response {
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

/// A request body as JSON, or its refusal (413 past `--max-body`, 400 if not JSON).
pub fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, Box<Response>> {
    let body = body.map_err(|rejection| {
        let message = format!("cannot read the request body: {}", rejection.body_text());
        Box::new(refuse(rejection.status(), &message, None))
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        Box::new(refuse(
            StatusCode::BAD_REQUEST,
            &format!("the request body is not JSON: {e}"),
            None,
        ))
    })
}

/// Queues `jobs` (a request's rows), or answers why not: 429 when the queue is full, 503
/// when the server is stopping. Rows queued before one that is refused are abandoned
/// with their handler, so they leave the batch at their first token.
pub fn queue_jobs(s: &Shared, jobs: Vec<Job>) -> Result<(), Box<Response>> {
    for job in jobs {
        // Counted before it is sent, so that the decoder never takes out what was not counted.
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
                return Err(Box::new(refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    &message,
                    None,
                )));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(Box::new(refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server is shutting down",
                    None,
                )))
            }
        }
    }
    Ok(())
}

/// The answer of a finished generation: its decoded text, cut at the first stop sequence,
/// in the request's `form`. Text that ran on until the grammar had to close it (a word
/// repeated to the budget's end) is no answer: it is left out, and `needle.error` says so.
pub fn final_answer(s: &Shared, done: &Done, stops: &StopTexts, form: AnswerForm) -> Answer {
    let text = s.tokenizer.decode(&done.decoded.generated_ids);
    let answer = answer_in_form(stops.cut(&text).0, form);
    match done.decoded.ran_on && answer.function_calls().is_empty() {
        true => Answer {
            text: String::new(),
            calls: Err(RAN_ON.to_string()),
            ..answer
        },
        false => answer,
    }
}

/// `needle.error` of an answer left out because it ran on.
const RAN_ON: &str = "the answer ran on to the end of its token budget, where the grammar \
                      closed it; its text is left out";

/// The answer `text` (decoded so far, or whole) says in the request's `form`: for a
/// structured answer, the one call's arguments as decoded so far as the text, and no calls
/// (an answer without a complete call keeps the reason it has none). Where the model chose
/// to call nothing and wrote no text (Needle's "respond" answer under `tool_choice` auto),
/// its reasoning is its text: the model's own words ("no tool matches this request"), where
/// an empty message reads as a failure to clients (pydantic-ai retries it, then gives up).
pub fn answer_in_form(text: &str, form: AnswerForm) -> Answer {
    let answer = parse_answer(text);
    match form {
        AnswerForm::Calls { declined_in_words } => match (&answer.calls, answer.text.is_empty()) {
            (Ok(Value::Array(calls)), true) if declined_in_words && calls.is_empty() => Answer {
                text: answer.reasoning.clone(),
                ..answer
            },
            _ => answer,
        },
        AnswerForm::Json => {
            let arguments = partial_calls(text)
                .first()
                .and_then(|call| call.arguments)
                .unwrap_or_default()
                .to_string();
            let calls = match answer.calls {
                Ok(_) => Ok(Value::Array(Vec::new())),
                Err(why) => Err(why),
            };
            Answer {
                text: arguments,
                calls,
                ..answer
            }
        }
    }
}

/// The events of a request's rows, each with its choice's index.
pub type ChoiceEvents = UnboundedReceiver<(usize, Event)>;

/// A streamed request's rows as the stream reads them: each event in turn, the first
/// token's latency counted, and the decoder's stop or the request's deadline as a failure.
pub struct DecoderEvents {
    events: ChoiceEvents,
    deadline: tokio::time::Instant,
    /// When the request arrived (its latency is counted from here).
    pub arrived: Instant,
    first_token: bool,
}

impl DecoderEvents {
    pub fn new(events: ChoiceEvents, deadline: tokio::time::Instant, arrived: Instant) -> Self {
        DecoderEvents {
            events,
            deadline,
            arrived,
            first_token: true,
        }
    }

    /// The next event of choice `.0`; `Event::Failed` when the decoder stopped or the
    /// deadline passed.
    pub async fn next(&mut self, s: &Shared) -> (usize, Event) {
        match tokio::time::timeout_at(self.deadline, self.events.recv()).await {
            Ok(Some((index, event))) => {
                if matches!(event, Event::Token(_)) && std::mem::take(&mut self.first_token) {
                    s.metrics.first_token(self.arrived.elapsed());
                }
                (index, event)
            }
            Ok(None) => (0, Event::Failed("the decoder stopped".into())),
            Err(_) => (0, Event::Failed(timed_out(s))),
        }
    }
}

/// Why a request that ran out of time is answered 504.
pub fn timed_out(s: &Shared) -> String {
    format!(
        "the request did not finish within {} s (--request-timeout)",
        s.timeout.as_secs_f64()
    )
}
