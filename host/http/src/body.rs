//! Request bodies and query strings: serde types, and extractors whose
//! refusals are the API's JSON errors (an oversized body is 413
//! `body_too_large`, malformed JSON 400 `invalid_request`).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use base64::Engine as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::Api;
use crate::error::ApiError;

/// A JSON body of type `T` (of a POST).
#[derive(Debug)]
pub(crate) struct Body<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<Api> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, api: &Api) -> Result<Self, ApiError> {
        // Its content type is checked before: the routes that take a body
        // are POSTs, and `guard` answers 415 to a POST that is not JSON.
        let bytes = match Bytes::from_request(request, api).await {
            Ok(bytes) => bytes,
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!(
                        "the request body exceeds this host's http.max_body of {} bytes",
                        api.inner.max_body
                    ),
                ));
            }
            Err(rejection) => return Err(ApiError::bad_request(rejection.body_text())),
        };
        // Parsed straight from the body. Only a body that does not parse
        // is parsed again, by axum's `Json`, for a message that names
        // where it went wrong (`jobs[3].key: …`): tracking that path
        // costs on every field.
        if let Ok(value) = serde_json::from_slice(&bytes) {
            return Ok(Self(value));
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}

/// A query string of type `T`.
#[derive(Debug)]
pub(crate) struct QueryOf<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequestParts<Api> for QueryOf<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, api).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}

/// A payload: text in `payload`, or bytes in `payload_base64`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Payload {
    #[serde(default)]
    payload: Option<String>,
    #[serde(default)]
    payload_base64: Option<String>,
}

impl Payload {
    pub(crate) fn bytes(self) -> Result<Vec<u8>, ApiError> {
        match (self.payload, self.payload_base64) {
            (Some(_), Some(_)) => {
                Err(ApiError::bad_request("give `payload` (text) or `payload_base64` (bytes), not both"))
            }
            (Some(text), None) => Ok(text.into_bytes()),
            (None, Some(encoded)) => {
                base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|error| {
                    ApiError::bad_request(format!("`payload_base64` is not standard base64: {error}"))
                })
            }
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// One job to dispatch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewJob {
    pub(crate) key: String,
    #[serde(default)]
    payload: Option<String>,
    #[serde(default)]
    payload_base64: Option<String>,
}

impl NewJob {
    /// Its key and payload bytes.
    pub(crate) fn into_parts(self) -> (String, Result<Vec<u8>, ApiError>) {
        (self.key, Payload { payload: self.payload, payload_base64: self.payload_base64 }.bytes())
    }
}

/// Jobs to dispatch together.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Batch {
    pub(crate) jobs: Vec<NewJob>,
}

/// `?state=&cursor=&limit=` of the job listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobsQuery {
    pub(crate) state: Option<String>,
    pub(crate) prefix: Option<String>,
    pub(crate) cursor: Option<String>,
    pub(crate) limit: Option<usize>,
}

/// `?limit=` of the events listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    pub(crate) limit: Option<usize>,
}

/// A payload shown in JSON: text when it is UTF-8, base64 otherwise.
pub(crate) fn show_payload(bytes: &[u8], object: &mut serde_json::Map<String, serde_json::Value>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object.insert("payload".into(), text.into()),
        Err(_) => object
            .insert("payload_base64".into(), base64::engine::general_purpose::STANDARD.encode(bytes).into()),
    };
}
