//! What a request must be before any route sees it, against browsers
//! turned into clients by a hostile page:
//!
//! - its `Host` names this API: an IP address (DNS rebinding needs a
//!   name), `localhost` when listening on loopback, or an entry of
//!   `http.allowed_hosts`; otherwise 421;
//! - a state-changing request (POST, DELETE) from a browser page comes
//!   from an allowed origin (its `Origin`, when sent, names an allowed
//!   host), otherwise 403;
//! - a POST carries `Content-Type: application/json` (which a page cannot
//!   send across origins without asking first), otherwise 415.
//!
//! And every error answer, whoever made it (the router's 405, a body
//! limit's 413), has the API's JSON shape.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Api;
use crate::error::ApiError;

/// The hosts a request may name.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    /// Listening on loopback: `localhost` is this machine.
    pub loopback: bool,
    /// Names given in `http.allowed_hosts`, lowercase.
    pub names: Vec<String>,
}

impl AllowedHosts {
    /// Whether `authority` (`host[:port]`, as in `Host`) names this API.
    fn allows(&self, authority: &str) -> bool {
        let host = host_of(authority).to_ascii_lowercase();
        if host.parse::<std::net::IpAddr>().is_ok() {
            return true;
        }
        (self.loopback && host == "localhost") || self.names.iter().any(|name| host_of(name) == host)
    }
}

/// The host part of `host[:port]` or `[v6]:port`.
fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

pub(crate) async fn check(State(api): State<Api>, request: Request, next: Next) -> Response {
    // HTTP/2 names the host in the request's `:authority`, which hyper
    // puts in its URI, as it does an HTTP/1.1 request's absolute target;
    // either takes the place of `Host` (RFC 9110, 7.2).
    let authority = request.uri().authority().map(axum::http::uri::Authority::as_str);
    if let Err(error) = admit(&api.inner.hosts, request.method(), authority, request.headers()) {
        return error.into_response();
    }
    next.run(request).await
}

fn admit(
    hosts: &AllowedHosts,
    method: &Method,
    authority: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let host = authority.or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok())).unwrap_or("");
    if !hosts.allows(host) {
        return Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "unknown_host",
            format!(
                "Host {host:?} does not name this API: use its IP address, localhost on loopback, \
                 or add the name to http.allowed_hosts"
            ),
        ));
    }
    if *method == Method::GET || *method == Method::HEAD {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        if !hosts.allows(authority) || origin == "null" {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "foreign_origin",
                format!("a page from {origin:?} may not change jobs here; allowed are this API's own hosts"),
            ));
        }
    }
    if *method == Method::POST {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .and_then(|c| c.split(';').next())
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "not_json",
                "a POST must carry `Content-Type: application/json` (with `{}` as its body when it has nothing to say)",
            ));
        }
    }
    Ok(())
}

/// Gives every error answer without a JSON body the API's shape.
pub(crate) async fn json_errors(request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    if !status.is_client_error() && !status.is_server_error() || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    // What axum said (bounded: its rejections are one line).
    let said = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said).trim().to_owned();
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = allowed_methods(&path).join(", ");
            let mut answer = ApiError::new(
                status,
                "method_not_allowed",
                format!("{path} does not take that method; it takes {allow}"),
            )
            .into_response();
            if let Ok(value) = header::HeaderValue::from_str(&allow) {
                answer.headers_mut().insert(header::ALLOW, value);
            }
            return answer;
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            ("payload_too_large", format!("the body is over http.max_body: {said}"))
        }
        _ => ("invalid_request", said),
    };
    let mut answer = ApiError::new(status, code, message).into_response();
    for name in [header::ALLOW, header::WWW_AUTHENTICATE] {
        if let Some(value) = parts.headers.get(&name) {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    answer
}

/// The methods the route table serves at `path`.
fn allowed_methods(path: &str) -> Vec<&'static str> {
    let segments: Vec<&str> = path.split('/').collect();
    crate::routes()
        .iter()
        .filter(|route| {
            let pattern: Vec<&str> = route.path.split('/').collect();
            pattern.len() == segments.len()
                && pattern.iter().zip(&segments).all(|(p, s)| p == s || (p.starts_with('{') && !s.is_empty()))
        })
        .map(|route| route.method)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_ip_addresses_localhost_on_loopback_or_listed_names() {
        let names = vec!["pulse.example.com".into(), "proxy.example:8080".into()];
        let hosts = AllowedHosts { loopback: true, names };
        for ok in [
            "127.0.0.1:7070",
            "localhost:7070",
            "LOCALHOST",
            "[::1]:7070",
            "10.0.0.5",
            "pulse.example.com:80",
            "proxy.example",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in
            ["rebind.attacker.example", "rebind.attacker.example:7070", "", "localhost.attacker.example"]
        {
            assert!(!hosts.allows(refused), "{refused}");
        }
        let remote = AllowedHosts { loopback: false, names: vec![] };
        assert!(!remote.allows("localhost:7070"));
    }
}
