//! `POST /v1/responses`: the Responses API's tool-calling subset, the path openai-agents
//! takes by default. The request is read as the chat-completions request it means
//! ([`responses_request`]) and decoded as one; the answer is a `response` object, whole or
//! as the Responses API's streaming events ([`responses_stream`]).

use crate::serve::chat::{admit, collect, completion_id};
use crate::serve::responses_object::{response_object, ResponseMeta};
use crate::serve::shared::{now, AppState};
use crate::serve::{responses_request, responses_stream};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Instant;

pub async fn create(State(s): AppState, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    let (value, request, events) = match admit(&s, body, responses_request::parse) {
        Ok(admitted) => admitted,
        Err(refusal) => return *refusal,
    };
    let meta = ResponseMeta {
        id: completion_id(&s, "resp_"),
        created_at: now(),
        model: s.model.clone(),
        request: value,
        temperature: request.temperature,
    };
    let deadline = tokio::time::Instant::now() + s.timeout;
    if request.stream {
        return responses_stream::stream(s, meta, &request, events, deadline, arrived)
            .into_response();
    }
    match collect(&s, &request, events, deadline, arrived).await {
        Ok(choices) => {
            let first = &choices[0];
            let object = response_object(&meta, Some((&first.answer, &first.done)), s.provider);
            Json(object).into_response()
        }
        Err(refusal) => *refusal,
    }
}
