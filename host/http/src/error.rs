//! Every error answer of the API: an HTTP status and a JSON body
//! `{"error": "<code>", "message": "<what was wrong and what is allowed>"}`.
//! The codes are stable (clients match on them); the messages are for
//! people.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub(crate) fn no_such_pool(pool: &str, known: &[String]) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "no_such_pool",
            format!("this host serves no pool {pool:?}; it serves {known:?}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": self.code, "message": self.message}));
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<pulse_pool::Error> for ApiError {
    fn from(error: pulse_pool::Error) -> Self {
        use pulse_pool::Error;
        let message = error.to_string();
        match error {
            Error::InvalidKey { .. } => Self::new(StatusCode::BAD_REQUEST, "invalid_key", message),
            Error::PayloadTooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
            }
            Error::ShuttingDown(_) | Error::Closed => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "pool_unavailable", message)
            }
            Error::Redis { source, .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                format!("{message}: {source}"),
            ),
            other => {
                tracing::warn!(error = %other, "an API request failed");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", other.to_string())
            }
        }
    }
}
