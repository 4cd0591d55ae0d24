//! `GET /v1/models` and `GET /v1/models/{id}`: the one model served, and the answer to a
//! request that names another. OpenAI's API and vLLM answer an unknown name with 404
//! `model_not_found`; llama.cpp's server answers as its one model whatever the name,
//! which would hide a client configured for another server, so this server does as
//! OpenAI does. A request that names no model gets the one model.

use crate::serve::response;
use crate::serve::shared::{refuse, AppState, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

pub async fn list(State(s): AppState) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&s)]}))
}

/// The one model, or 404 `model_not_found` for any other id.
pub async fn retrieve(State(s): AppState, Path(id): Path<String>) -> Response {
    match id == s.model {
        true => Json(model_object(&s)).into_response(),
        false => unknown_model(&s, &id),
    }
}

/// OpenAI's model object, with vLLM's `max_model_len` (the positions a prompt and its
/// answer share), which clients size their context by (llama-index's `context_window`).
fn model_object(s: &Shared) -> Value {
    json!({
        "id": s.model,
        "object": "model",
        "created": s.started,
        "owned_by": "needle-onnx",
        "max_model_len": s.max_seq_len,
    })
}

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
pub fn wrong_model(s: &Shared, body: &Value) -> Option<Response> {
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
