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
    let Some(expected) = &api.inner.token else {
        return next.run(request).await;
    };
    let given = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(
        |value| {
            // The scheme is case-insensitive (RFC 9110 §11.1).
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        },
    );
    match given {
        Some(given) if same(given.trim().as_bytes(), expected.0.as_bytes()) => next.run(request).await,
        Some(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the bearer token is not this host's")
                .into_response()
        }
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this host needs `Authorization: Bearer <token>` (http.token of its config)",
        )
        .into_response(),
    }
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
