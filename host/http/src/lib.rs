//! The HTTP API of `pulse-host`: the pools this host serves, their
//! workers and jobs as JSON; dispatch, stop, notify, retry and forget with
//! the pool's typed outcomes; Prometheus metrics; health and readiness; a
//! live status page. `docs/http.md` describes it for users and
//! `docs/openapi.json` route by route.
//!
//! # Layout
//! - this file: [`Api`] (what handlers share), the route table
//!   ([`routes`]: the router is built from it, and the OpenAPI document is
//!   checked against it), [`serve`].
//! - `jobs`, `pools`: the JSON routes. `body`: request types and
//!   extractors. `error`: the error answers.
//! - `auth`: the optional bearer token. `guard`: the `Host`, `Origin` and
//!   content type a request must have; JSON for every error. `serve`:
//!   connections, with their timeouts and limit. `metrics`: `/metrics`
//!   and the process's recorder. `page`: the status page.
//!
//! The API is a client of the pools like the CLI: it holds each pool's
//! [`pulse_pool::Node`] and asks it; it keeps no state of its own beyond
//! what is registered.

mod auth;
mod body;
mod error;
mod guard;
mod jobs;
pub mod metrics;
mod page;
mod pools;
mod series;
mod serve;
mod trace;

pub use guard::AllowedHosts;
pub use serve::{ServeOptions, serve, tls_config};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use pulse_pool::Node;
use serde_json::json;

use crate::error::ApiError;

/// How the API is set up. Its `Debug` output leaves the token out.
///
/// Defaults: no token, `max_body` 4 MiB, no metrics, loopback names only.
#[derive(Clone)]
pub struct ApiOptions {
    /// When set, every route but `/healthz` and `/readyz` needs
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// The largest request body accepted, bytes.
    pub max_body: usize,
    /// The recorder `/metrics` renders ([`metrics::install`]); none: 404.
    pub metrics: Option<PrometheusHandle>,
    /// The names a request's `Host` (and a browser's `Origin`) may give.
    pub hosts: AllowedHosts,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self { token: None, max_body: 4 << 20, metrics: None, hosts: AllowedHosts::default() }
    }
}

impl std::fmt::Debug for ApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiOptions")
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("max_body", &self.max_body)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// What the handlers share: the pools this host serves, readiness, the
/// options. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pools: RwLock<BTreeMap<String, Pool>>,
    phase: AtomicU8,
    token: RwLock<Option<auth::Token>>,
    max_body: usize,
    metrics: Option<PrometheusHandle>,
    hosts: AllowedHosts,
    /// What the status page charts (`series`).
    series: RwLock<series::Series>,
}

/// A pool the API answers for.
#[derive(Debug, Clone)]
struct Pool {
    node: Arc<Node>,
    events: pulse_pool::EmittedEvents,
    /// The plugin whose workers this host runs in it; none when it only
    /// dispatches into it (for a schedule).
    plugin: Option<String>,
}

const STARTING: u8 = 0;
const READY: u8 = 1;
const LEAVING: u8 = 2;

impl Api {
    /// An API answering for no pool yet, not ready.
    pub fn new(options: ApiOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                pools: RwLock::new(BTreeMap::new()),
                phase: AtomicU8::new(STARTING),
                token: RwLock::new(options.token.map(auth::Token)),
                max_body: options.max_body.max(1),
                metrics: options.metrics,
                hosts: options.hosts,
                series: RwLock::default(),
            }),
        }
    }

    /// Answers for `node`'s pool from now on; `plugin` names the plugin
    /// whose workers this host runs in it (none: it only dispatches).
    ///
    /// # Errors
    /// Redis failures opening what the pool's jobs emitted.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is registered until it returns.
    pub async fn add_pool(&self, node: Arc<Node>, plugin: Option<&str>) -> Result<(), pulse_pool::Error> {
        let events = node.emitted().await?;
        let pool = Pool { node: node.clone(), events, plugin: plugin.map(str::to_owned) };
        write(&self.inner.pools).insert(node.pool().to_owned(), pool);
        Ok(())
    }

    /// No longer answers for `pool` (this host left it).
    pub fn remove_pool(&self, pool: &str) {
        write(&self.inner.pools).remove(pool);
    }

    /// The bearer token requests must carry from now on (`None`: none).
    pub fn set_token(&self, token: Option<String>) {
        *write(&self.inner.token) = token.map(auth::Token);
    }

    /// `/readyz` answers 200 from now on: every pool joined, every plugin
    /// loaded.
    pub fn set_ready(&self) {
        self.inner.phase.store(READY, Ordering::Relaxed);
    }

    /// `/readyz` answers 503 from now on: the host is leaving.
    pub fn set_leaving(&self) {
        self.inner.phase.store(LEAVING, Ordering::Relaxed);
    }

    fn pools(&self) -> Vec<(String, Pool)> {
        read(&self.inner.pools).iter().map(|(name, pool)| (name.clone(), pool.clone())).collect()
    }

    fn pool(&self, name: &str) -> Result<Pool, ApiError> {
        let pools = read(&self.inner.pools);
        pools
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::no_such_pool(name, &pools.keys().cloned().collect::<Vec<_>>()))
    }

    fn node(&self, name: &str) -> Result<Arc<Node>, ApiError> {
        self.pool(name).map(|pool| pool.node)
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One route: its method and path as the OpenAPI document writes them,
/// whether it is open without the token, and its handler.
#[derive(Debug)]
pub struct Route {
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    /// The path, with `{name}` captures.
    pub path: &'static str,
    /// Served without the bearer token: the health checks, and the static
    /// status page and OpenAPI document (they hold no data).
    pub open: bool,
    handler: MethodRouter<Api>,
}

fn route(method: &'static str, path: &'static str, handler: MethodRouter<Api>) -> Route {
    Route { method, path, open: false, handler }
}

/// Every route the API serves; the router is built from this table.
pub fn routes() -> Vec<Route> {
    let open = |method, path, handler| Route { open: true, ..route(method, path, handler) };
    vec![
        open("GET", "/healthz", get(healthz)),
        open("GET", "/readyz", get(readyz)),
        route("GET", "/metrics", get(metrics::render)),
        // Static: no data until the page's requests, which carry the token.
        open("GET", "/", get(page::status_page)),
        open("GET", "/openapi.json", get(page::openapi)),
        route("GET", "/api/pools", get(pools::list)),
        route("GET", "/api/pools/{pool}/workers", get(pools::workers)),
        route("GET", "/api/pools/{pool}/events", get(pools::events)),
        route("GET", "/api/pools/{pool}/series", get(series::get)),
        route("GET", "/api/pools/{pool}/jobs", get(jobs::list)),
        route("POST", "/api/pools/{pool}/jobs", post(jobs::dispatch)),
        route("POST", "/api/pools/{pool}/batch", post(jobs::batch)),
        route("GET", "/api/pools/{pool}/jobs/{key}", get(jobs::status)),
        route("DELETE", "/api/pools/{pool}/jobs/{key}", delete(jobs::stop)),
        route("POST", "/api/pools/{pool}/jobs/{key}/notify", post(jobs::notify)),
        route("POST", "/api/pools/{pool}/jobs/{key}/retry", post(jobs::retry)),
        route("POST", "/api/pools/{pool}/jobs/{key}/forget", post(jobs::forget)),
    ]
}

/// The router of [`routes`], with the token check, the body limit, the
/// request checks of `guard`, JSON errors and a JSON 404 for everything
/// else.
pub fn router(api: Api) -> Router {
    let mut router = Router::new();
    for Route { method, path, open, handler } in routes() {
        // The check runs whether or not a token is set now: a reload of
        // the configuration may set one.
        let handler = if open {
            handler
        } else {
            handler
                .route_layer(axum::middleware::from_fn_with_state(api.clone(), auth::require_token))
                .route_layer(axum::middleware::from_fn(move |request, next| {
                    trace::serve(method, path, request, next)
                }))
        };
        router = router.route(path, handler);
    }
    router
        .fallback(no_such_route)
        .layer(DefaultBodyLimit::max(api.inner.max_body))
        .layer(axum::middleware::from_fn_with_state(api.clone(), guard::check))
        .layer(axum::middleware::from_fn(guard::json_errors))
        .with_state(api)
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn readyz(State(api): State<Api>) -> Response {
    let pools: Vec<String> = read(&api.inner.pools).keys().cloned().collect();
    match api.inner.phase.load(Ordering::Relaxed) {
        READY => axum::Json(json!({"ready": true, "pools": pools})).into_response(),
        LEAVING => not_ready("the host is leaving: its workers hand their jobs over", pools),
        _ => not_ready("loading plugins and joining pools", pools),
    }
}

fn not_ready(message: &str, pools: Vec<String>) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({"ready": false, "error": "not_ready", "message": message, "pools": pools})),
    )
        .into_response()
}

async fn no_such_route(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        format!("no route {}: see /openapi.json for the routes of this API", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The OpenAPI document in the repository describes exactly the routes
    /// the router is built from: no route undocumented, none documented
    /// that is not served.
    #[test]
    fn the_openapi_document_lists_exactly_the_served_routes() {
        let text = include_str!("../../../docs/openapi.json");
        let document: serde_json::Value = serde_json::from_str(text).expect("docs/openapi.json is JSON");
        let documented: BTreeSet<(String, String)> = document["paths"]
            .as_object()
            .expect("paths")
            .iter()
            .flat_map(|(path, operations)| {
                operations
                    .as_object()
                    .expect("operations")
                    .keys()
                    .map(move |method| (method.to_uppercase(), path.clone()))
            })
            .collect();
        let served: BTreeSet<(String, String)> =
            super::routes().iter().map(|r| (r.method.to_owned(), r.path.to_owned())).collect();
        let missing: Vec<_> = served.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&served).collect();
        assert!(missing.is_empty() && extra.is_empty(), "undocumented: {missing:?}; not served: {extra:?}");
        for route in super::routes() {
            let secured = document["paths"][route.path][route.method.to_lowercase()]["security"]
                != serde_json::json!([]);
            assert_eq!(
                secured, !route.open,
                "{} {}: the document and the router disagree on the token",
                route.method, route.path
            );
        }
    }
}
