//! The status page and the OpenAPI document, both compiled into the
//! binary: the page has no external assets (it works offline) and reads
//! everything through the JSON API, refreshing every second.

use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};

/// `GET /`.
pub(crate) async fn status_page() -> Html<&'static str> {
    Html(include_str!("status.html"))
}

/// `GET /openapi.json`: the document kept in the repository.
pub(crate) async fn openapi() -> Response {
    let mut response = include_str!("../../../docs/openapi.json").into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
