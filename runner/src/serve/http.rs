//! The routes: `POST /v1/chat/completions` ([`chat`]), `POST /v1/responses`
//! ([`responses`]), `GET /v1/models[/{id}]`
//! ([`models`]), `GET /metrics`, `GET /health`; behind the API key when there is one, every
//! answer counted. Every refusal is OpenAI's error object (`shared::refuse`).

use crate::serve::auth::{self, ApiKey, Guard};
use crate::serve::shared::{refuse, AppState, Shared};
use crate::serve::{chat, metrics, models, response, responses};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

/// The routes, `/health` aside behind `api_key` when there is one, every answer counted.
pub fn router(shared: Arc<Shared>, max_body: usize, api_key: Option<ApiKey>) -> Router {
    let metrics = shared.metrics.clone();
    let mut app = Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::retrieve))
        .route("/metrics", get(metrics_text))
        .route("/health", get(health))
        .fallback(move |request: axum::extract::Request| async move {
            response::discard_body(request, max_body).await;
            refuse(
                StatusCode::NOT_FOUND,
                "no such endpoint (POST /v1/chat/completions, POST /v1/responses, GET /v1/models, GET /v1/models/{id}, \
                 GET /metrics, GET /health)",
                None,
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(shared);
    if let Some(key) = api_key {
        app = app.layer(middleware::from_fn_with_state(
            Arc::new(Guard { key, max_body }),
            auth::require_key,
        ));
    }
    app.layer(middleware::from_fn_with_state(
        metrics,
        metrics::count_requests,
    ))
}

async fn health(State(s): AppState) -> Json<Value> {
    Json(json!({"status": "ok", "model": s.model, "provider": s.provider}))
}

async fn metrics_text(State(s): AppState) -> Response {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], s.metrics.render()).into_response()
}
