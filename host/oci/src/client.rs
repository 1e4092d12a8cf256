//! The registry's HTTP API (the OCI distribution spec): manifests and
//! blobs by digest or tag, uploads, and the two ways registries ask for
//! credentials (`Basic`, and `Bearer` tokens from a realm).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::{Error, Reference};

/// The manifests this host reads: OCI's, and Docker's of the same shape.
pub(crate) const MANIFEST_TYPES: &str =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// The largest manifest read (the spec's own limit is 4 MiB).
const MAX_MANIFEST: usize = 4 << 20;
/// The largest blob read: a component far larger than any plugin.
const MAX_BLOB: usize = 512 << 20;
/// Redirects followed for one request (registries send blobs to storage).
const MAX_REDIRECTS: usize = 5;

/// A user name and password for registries that ask for one.
#[derive(Clone)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or access token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).finish_non_exhaustive()
    }
}

impl Credentials {
    /// `PULSE_REGISTRY_USERNAME` and `PULSE_REGISTRY_PASSWORD`, when both
    /// are set.
    pub fn from_env() -> Option<Self> {
        let username = std::env::var("PULSE_REGISTRY_USERNAME").ok()?;
        let password = std::env::var("PULSE_REGISTRY_PASSWORD").ok()?;
        Some(Self { username, password })
    }

    fn basic(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
    }
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A client of registries. Cheap to clone; tokens are kept per registry
/// and repository for the client's life.
#[derive(Clone)]
pub struct Client {
    http: HttpClient<Connector, Full<Bytes>>,
    credentials: Option<Credentials>,
    /// `Authorization` values that worked, by registry and repository.
    authorizations: Arc<Mutex<HashMap<String, HeaderValue>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("credentials", &self.credentials).finish_non_exhaustive()
    }
}

/// An answer: status, headers and the whole body.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Client {
    /// A client trusting the webpki roots, with `credentials` for
    /// registries that ask.
    pub fn new(credentials: Option<Credentials>) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports rustls's default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            http: HttpClient::builder(TokioExecutor::new()).build(connector),
            credentials,
            authorizations: Arc::default(),
        }
    }

    /// `GET` a manifest by digest or tag.
    pub(crate) async fn manifest(&self, reference: &Reference, name: &str) -> Result<Answer, Error> {
        let url = format!("{}/manifests/{name}", reference.base_url());
        self.send(reference, Method::GET, &url, Some(MANIFEST_TYPES), None, MAX_MANIFEST).await
    }

    /// `GET` a blob.
    pub(crate) async fn blob(&self, reference: &Reference, digest: &str) -> Result<Answer, Error> {
        let url = format!("{}/blobs/{digest}", reference.base_url());
        self.send(reference, Method::GET, &url, None, None, MAX_BLOB).await
    }

    /// Sends a request to `reference`'s registry, answering its
    /// credential challenge once and following redirects.
    pub(crate) async fn send(
        &self,
        reference: &Reference,
        method: Method,
        url: &str,
        accept: Option<&str>,
        body: Option<(&str, Bytes)>,
        limit: usize,
    ) -> Result<Answer, Error> {
        let scope = format!("{}/{}", reference.registry, reference.repository);
        let mut authorization = self.authorizations.lock().expect("not poisoned").get(&scope).cloned();
        let mut challenged = false;
        loop {
            let answer = self
                .follow(reference, &method, url, accept, body.clone(), authorization.clone(), limit)
                .await?;
            if answer.status != StatusCode::UNAUTHORIZED || challenged {
                if answer.status == StatusCode::UNAUTHORIZED {
                    return Err(Error::Unauthorized {
                        registry: reference.registry.clone(),
                        detail: registry_message(&answer.body),
                        credentials: self.credentials.is_some(),
                    });
                }
                if let Some(value) = authorization {
                    self.authorizations.lock().expect("not poisoned").insert(scope, value);
                }
                return Ok(answer);
            }
            challenged = true;
            authorization = Some(self.answer_challenge(reference, &answer.headers).await?);
        }
    }

    /// One request with its redirects (credentials go to the registry's
    /// own host only).
    #[allow(clippy::too_many_arguments, reason = "one private step of `send`")]
    async fn follow(
        &self,
        reference: &Reference,
        method: &Method,
        url: &str,
        accept: Option<&str>,
        body: Option<(&str, Bytes)>,
        authorization: Option<HeaderValue>,
        limit: usize,
    ) -> Result<Answer, Error> {
        let mut url = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let uri: http::Uri = url.parse().map_err(|_| Error::Protocol {
                registry: reference.registry.clone(),
                detail: format!("it named a location that is not a URL: {url:?}"),
            })?;
            let same_host = uri.authority().is_some_and(|a| a.as_str() == reference.registry);
            let mut request = Request::builder().method(method.clone()).uri(uri.clone());
            if let Some(accept) = accept {
                request = request.header(header::ACCEPT, accept);
            }
            if let (Some(value), true) = (&authorization, same_host) {
                request = request.header(header::AUTHORIZATION, value.clone());
            }
            let body = match &body {
                Some((content_type, bytes)) => {
                    request = request.header(header::CONTENT_TYPE, *content_type);
                    Full::new(bytes.clone())
                }
                None => Full::default(),
            };
            let request = request.body(body).expect("a request of valid parts");
            let response = self.http.request(request).await.map_err(|error| Error::Unreachable {
                registry: reference.registry.clone(),
                detail: error_chain(&error),
            })?;
            let status = response.status();
            let headers = response.headers().clone();
            if status.is_redirection()
                && let Some(location) = headers.get(header::LOCATION)
            {
                url = resolve(&uri, location.to_str().unwrap_or_default());
                continue;
            }
            let body = Limited::new(response.into_body(), limit).collect().await.map_err(|error| {
                Error::Unreachable {
                    registry: reference.registry.clone(),
                    detail: format!("reading an answer: {error}"),
                }
            })?;
            return Ok(Answer { status, headers, body: body.to_bytes() });
        }
        Err(Error::Protocol {
            registry: reference.registry.clone(),
            detail: format!("more than {MAX_REDIRECTS} redirects for {url}"),
        })
    }

    /// What to send after a 401: `Basic` credentials, or a `Bearer`
    /// token fetched from the realm the challenge names.
    async fn answer_challenge(
        &self,
        reference: &Reference,
        headers: &HeaderMap,
    ) -> Result<HeaderValue, Error> {
        let challenge =
            headers.get(header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let unauthorized = |detail: &str| Error::Unauthorized {
            registry: reference.registry.clone(),
            detail: detail.to_owned(),
            credentials: self.credentials.is_some(),
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let credentials = self
                .credentials
                .as_ref()
                .ok_or_else(|| unauthorized("it asks for a user name and password"))?;
            return HeaderValue::from_str(&credentials.basic())
                .map_err(|_| unauthorized("the credentials are not valid in a header"));
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized(&format!("it asks for {challenge:?}, which this host does not speak")));
        }
        let params = parse_params(params);
        let realm = params.get("realm").ok_or_else(|| unauthorized("its Bearer challenge names no realm"))?;
        let mut query = Vec::new();
        for key in ["service", "scope"] {
            if let Some(value) = params.get(key) {
                query.push(format!("{key}={}", percent_encode(value)));
            }
        }
        let url = if query.is_empty() { realm.clone() } else { format!("{realm}?{}", query.join("&")) };
        let uri: http::Uri =
            url.parse().map_err(|_| unauthorized(&format!("its token realm {realm:?} is not a URL")))?;
        let mut request = Request::get(uri);
        if let Some(credentials) = &self.credentials {
            request = request.header(header::AUTHORIZATION, credentials.basic());
        }
        let request = request.body(Full::default()).expect("a request of valid parts");
        let response = self
            .http
            .request(request)
            .await
            .map_err(|error| Error::Unreachable { registry: realm.clone(), detail: error_chain(&error) })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), 1 << 20)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if !status.is_success() {
            return Err(unauthorized(&format!("its token service answered {status}")));
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token =
            serde_json::from_slice(&body).map_err(|_| unauthorized("its token service answered no JSON"))?;
        let token = token
            .token
            .or(token.access_token)
            .ok_or_else(|| unauthorized("its token service gave no token"))?;
        HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| unauthorized("its token is not valid in a header"))
    }
}

/// `Location` against the request's URI (registries send both relative
/// and absolute ones).
pub(crate) fn resolve(base: &http::Uri, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.to_owned();
    }
    let scheme = base.scheme_str().unwrap_or("https");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or_default();
    format!("{scheme}://{authority}{location}")
}

/// `key="value",key2="value2"` of a challenge.
fn parse_params(text: &str) -> HashMap<String, String> {
    let mut params = HashMap::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.split_once('"') {
                Some((value, after)) => (value, after),
                None => (quoted, ""),
            },
            None => after.split_once(',').map_or((after, ""), |(v, a)| (v, a)),
        };
        params.insert(key, value.to_owned());
        rest = after.trim_start_matches(',').trim();
    }
    params
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The registry's own words from an error body (`{"errors":[{"message"}]}`).
pub(crate) fn registry_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<One>,
    }
    #[derive(serde::Deserialize)]
    struct One {
        code: Option<String>,
        message: Option<String>,
    }
    match serde_json::from_slice::<Errors>(body) {
        Ok(errors) => errors
            .errors
            .into_iter()
            .map(|e| [e.code, e.message].into_iter().flatten().collect::<Vec<_>>().join(": "))
            .collect::<Vec<_>>()
            .join("; "),
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned(),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_s_parameters_are_read() {
        let params = parse_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(params["realm"], "https://auth.example/token");
        assert_eq!(params["service"], "registry.example");
        assert_eq!(params["scope"], "repository:a/b:pull,push");
        assert_eq!(percent_encode("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }

    #[test]
    fn locations_resolve_against_the_request() {
        let base: http::Uri = "http://127.0.0.1:5000/v2/x/blobs/uploads/".parse().unwrap();
        assert_eq!(
            resolve(&base, "/v2/x/blobs/uploads/abc?_state=1"),
            "http://127.0.0.1:5000/v2/x/blobs/uploads/abc?_state=1"
        );
        assert_eq!(resolve(&base, "https://s3.example/b"), "https://s3.example/b");
    }
}
