//! `--api-key`: every route but `/health` (which load balancers and orchestrators probe
//! without credentials) answers 401 unless the request carries `Authorization: Bearer KEY`,
//! as OpenAI's API does.

use crate::serve::response;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;

/// The key requests must present.
#[derive(Clone)]
pub struct ApiKey(Vec<u8>);

impl std::fmt::Debug for ApiKey {
    /// Never the key itself, which would end up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

impl ApiKey {
    /// `None` for an empty key, which would let every request through.
    pub fn new(key: &str) -> Option<ApiKey> {
        (!key.is_empty()).then(|| ApiKey(key.as_bytes().to_vec()))
    }

    /// Whether `given` is the key, in time that depends only on `given`'s length: every
    /// byte is compared and the differences folded together, so how long the answer takes
    /// says nothing about how much of the key a guess had right. A hand-written xor-fold
    /// rather than the `subtle` crate: eight lines do not need a dependency, and
    /// `black_box` keeps the compiler from turning the fold back into an early exit.
    fn matches(&self, given: &[u8]) -> bool {
        let key = &self.0;
        let mut difference = u8::from(given.len() != key.len());
        for (i, &byte) in given.iter().enumerate() {
            difference |= byte ^ key[i % key.len()];
            difference = std::hint::black_box(difference);
        }
        difference == 0
    }
}

/// What the middleware needs: the key, and how much of a refused request's body it reads.
pub struct Guard {
    pub key: ApiKey,
    /// The server's body limit (`--max-body`).
    pub max_body: usize,
}

/// The middleware: passes `/health` and requests with the key, answers 401 otherwise.
pub async fn require_key(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let message = match given {
        Some(given) if guard.key.matches(given.trim().as_bytes()) => {
            return next.run(request).await
        }
        Some(_) => "Incorrect API key provided.",
        None => "No API key provided: send the server's --api-key as 'Authorization: Bearer KEY'.",
    };
    response::discard_body(request, guard.max_body).await;
    unauthorized(message)
}

fn unauthorized(message: &str) -> Response {
    let mut body = response::error(message, "invalid_request_error", None);
    body["error"]["code"] = "invalid_api_key".into();
    (StatusCode::UNAUTHORIZED, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_key_itself_matches() {
        let key = ApiKey::new("sk-local-123").unwrap();
        assert!(key.matches(b"sk-local-123"));
        for other in [
            &b""[..],
            b"sk-local-12",
            b"sk-local-1234",
            b"sk-local-124",
            b"sk-local-123sk-local-123",
            b"tk-local-123",
        ] {
            assert!(!key.matches(other), "{other:?}");
        }
        assert!(ApiKey::new("").is_none());
    }
}
