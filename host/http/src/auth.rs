//! The optional bearer token: when configured, every route but the
//! health checks answers 401 unless the request carries
//! `Authorization: Bearer <token>`.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Api;
use crate::error::ApiError;

/// The token a request must carry; `Debug` leaves it out.
pub(crate) struct Token(pub(crate) String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

pub(crate) async fn require_token(State(api): State<Api>, request: Request, next: Next) -> Response {
    let given = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(
        |value| {
            // The scheme is case-insensitive (RFC 9110 §11.1).
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        },
    );
    // Read per request (a reload of the configuration may change it) and
    // released before the request goes on.
    let verdict = match (crate::read(&api.inner.token).as_ref(), given) {
        (None, _) => Ok(()),
        (Some(expected), Some(given)) if same(given.trim().as_bytes(), expected.0.as_bytes()) => Ok(()),
        (Some(_), Some(_)) => Err("the bearer token is not this host's"),
        (Some(_), None) => Err("this host needs `Authorization: Bearer <token>` (http.token of its config)"),
    };
    match verdict {
        Ok(()) => next.run(request).await,
        Err(message) => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response(),
    }
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
