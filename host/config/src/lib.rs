//! `config.toml` of pulse-host: parsed, then validated as a whole, then
//! handed to the binary as typed settings. Libraries never see TOML.
//!
//! # Layout
//! - this file: [`Config`] and its sections, [`load`], [`ConfigError`].
//! - `raw`: the file's shape (serde, unknown keys refused, positions kept).
//! - `units`: durations and sizes written as strings.
//!
//! Every problem of a file is reported at once, each with its line and
//! what is allowed.
#![warn(missing_docs)]

mod raw;
mod secret;
pub mod units;

pub use secret::{Secret, redact_url};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A loaded, valid configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was read from.
    pub path: PathBuf,
    /// Where Redis is.
    pub redis: RedisConfig,
    /// The node's settings.
    pub node: NodeConfig,
    /// The plugin runtime's settings.
    pub runtime: RuntimeConfig,
    /// The plugins, in file order.
    pub plugins: Vec<PluginConfig>,
    /// The schedules, in file order.
    pub schedules: Vec<ScheduleConfig>,
    /// `[http]`: the HTTP API, metrics and status page; none when the
    /// section is absent (nothing is served).
    pub http: Option<HttpConfig>,
    /// `[telemetry]`: where the host sends its traces; none when the
    /// section is absent (no span is made).
    pub telemetry: Option<TelemetryConfig>,
}

/// `[telemetry]`: OpenTelemetry traces, sent over OTLP/HTTP (protobuf).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `otlp_endpoint`: the collector's base address (`http://host:4318`);
    /// spans go to `<otlp_endpoint>/v1/traces`. No trailing `/`.
    pub otlp_endpoint: String,
    /// `service_name` (default `pulse-host`): the `service.name` of every
    /// span.
    pub service_name: String,
    /// `sample_ratio` (default 1.0): the share of traces begun here that
    /// are kept; a trace begun elsewhere follows its caller's choice.
    pub sample_ratio: f64,
}

/// The value each key takes when config.toml leaves it out. Each is
/// written once, in the library that uses it (the pool's `NodeOptions`,
/// the runtime's `RuntimeConfig` and `Limits`, the HTTP server's
/// options): the binary builds this from their defaults and a test of
/// its checks that config.toml documents the same values.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// `[node]`.
    pub node: NodeConfig,
    /// `[runtime]` (`cache_dir` is none unless set).
    pub runtime: RuntimeConfig,
    /// `[plugin.limits]` and `[schedule.limits]` (`instances` is shared
    /// out of `runtime.max_instances` instead).
    pub limits: Limits,
    /// `max_concurrent_calls` of a plugin.
    pub max_concurrent_calls: usize,
    /// `[http]`'s limits.
    pub http: HttpDefaults,
    /// `redis.response_timeout`.
    pub redis_response_timeout: Duration,
}

/// The defaults of `[http]`'s limits (see [`HttpConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpDefaults {
    /// `max_body`, bytes.
    pub max_body: u64,
    /// `header_timeout`.
    pub header_timeout: Duration,
    /// `idle_timeout`.
    pub idle_timeout: Duration,
    /// `max_connections`.
    pub max_connections: u32,
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// `listen`: the address to serve on (default `127.0.0.1:7070`; a port
    /// alone means loopback).
    pub listen: std::net::SocketAddr,
    /// `token` or `token_file` (PULSE_HTTP_TOKEN overrides both, read by
    /// the binary): when set, every request but `/healthz` and `/readyz`
    /// needs `Authorization: Bearer <token>`.
    pub token: Option<Secret>,
    /// `max_body`: the largest request body accepted, bytes.
    pub max_body: u64,
    /// `allowed_hosts`: the names a request's `Host` header may give
    /// besides the listen address (and `localhost` on loopback).
    pub allowed_hosts: Vec<String>,
    /// `header_timeout`: how long a client may take to send a request's
    /// headers.
    pub header_timeout: Duration,
    /// `idle_timeout`: how long a connection may stay open without a
    /// request.
    pub idle_timeout: Duration,
    /// `max_connections`: connections served at once; more wait in the
    /// kernel's backlog.
    pub max_connections: u32,
    /// `tls_cert_file` and `tls_key_file` (PEM): the API serves HTTPS
    /// with them; plain HTTP without.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// `[redis]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `url`; none: the host runs a private `redis-server`. It may hold a
    /// password: printed only through [`redact_url`].
    pub url: Option<Secret>,
    /// `data_dir`: where the private `redis-server` keeps its socket and
    /// append-only file (default: `.pulse-host` beside the config file).
    pub data_dir: PathBuf,
    /// `tls_ca_file`: the certificate authorities (PEM) a `rediss://`
    /// server's certificate must come from; none: the system's.
    pub tls_ca_file: Option<PathBuf>,
    /// `tls_cert_file` and `tls_key_file`: this host's certificate and key
    /// (PEM), for servers that ask clients for one.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// `response_timeout`: how long a command may wait for Redis's answer.
    pub response_timeout: Duration,
}

/// `[node]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// `max_jobs` (0: no limit).
    pub max_jobs: u64,
    /// `max_payload`, bytes.
    pub max_payload: u64,
    /// `reply_timeout`.
    pub reply_timeout: Duration,
    /// `confirm_replicas`: replicas that must hold a dispatch before it
    /// is confirmed.
    pub confirm_replicas: u32,
    /// `slot_groups`: the groups a pool's slots fall into, each under a
    /// hash tag of its own (fixed when the pool is created).
    pub slot_groups: u32,
    /// `max_attempts`.
    pub max_attempts: u32,
    /// `retry_backoff`.
    pub retry_backoff: Duration,
    /// `events_retention`: events of each pool's events stream.
    pub events_retention: u64,
    /// `events_max_bytes`: bytes of events (keys and payloads) each pool's
    /// events stream keeps.
    pub events_max_bytes: u64,
    /// `lease_ttl`: how long a worker's lease lasts without renewal.
    pub lease_ttl: Duration,
    /// `shutdown_timeout`: how long the jobs' `stop` calls may take in all
    /// when a host leaves or a pool shuts down.
    pub shutdown_timeout: Duration,
}

/// `[runtime]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `max_instances`.
    pub max_instances: u32,
    /// `ready_instances`: the most instances a plugin in job isolation
    /// keeps made ahead of need.
    pub ready_instances: u32,
    /// `threads`: the process's worker threads (plugins' calls, the
    /// pools' workers, HTTP); 0: `TOKIO_WORKER_THREADS`, else one per core.
    pub threads: u32,
    /// `max_memory_per_instance`, bytes.
    pub max_memory_per_instance: u64,
    /// `memory_reservation`, bytes: the address space each instance's
    /// memory reserves.
    pub memory_reservation: u64,
    /// `cache_dir`.
    pub cache_dir: Option<PathBuf>,
    /// `fuel`.
    pub fuel: bool,
}

/// A value of `[plugin.settings]` or `[schedule.settings]`: written in the
/// file, or read from the environment (`{ env = "NAME" }`) or a file
/// (`{ file = "PATH" }`). Those read are secrets: `Debug` prints
/// `[redacted]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// Written out in config.toml.
    Plain(String),
    /// Read from the environment or a file.
    Secret(Secret),
}

impl Setting {
    /// The value, for the plugin (never for a message).
    pub fn value(&self) -> &str {
        match self {
            Setting::Plain(text) => text,
            Setting::Secret(secret) => secret.expose(),
        }
    }
}

/// One `[[plugin]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// `name`.
    pub name: String,
    /// `path`: a file (resolved against the config file's folder) or a
    /// registry reference, with `verify`.
    pub source: Source,
    /// `pool` (default: the name).
    pub pool: String,
    /// `workers` on this host.
    pub workers: u32,
    /// `isolation`.
    pub isolation: Isolation,
    /// `version`: a name for this release of the plugin, shown beside its
    /// digest in listings (empty when not set).
    pub version: String,
    /// `upgrade`: whether the pool takes a new release of the plugin while
    /// it runs another.
    pub upgrade: Upgrade,
    /// `upgrade_window`: how long each worker a new release replaces is
    /// judged before the next is replaced (0: not judged).
    pub upgrade_window: Duration,
    /// `upgrade_max_failed_percent`: how many more of its jobs, in
    /// percent, a new release may fail than the release it replaces.
    pub upgrade_max_failed_percent: u32,
    /// `max_concurrent_calls`: calls of different jobs a worker makes at
    /// once.
    pub max_concurrent_calls: usize,
    /// `allowed_outbound_hosts`: where its jobs may send HTTP requests
    /// (checked when the plugin is loaded).
    pub allowed_outbound_hosts: Vec<String>,
    /// `outbound_ca_file`: certificate authorities (PEM) its HTTPS
    /// requests trust beside the webpki roots.
    pub outbound_ca_file: Option<PathBuf>,
    /// `outbound_fence_header`: the header (lower case) each request of a
    /// job carries the job's fence in, `pulse-fence` unless set; `None`
    /// when set to `""`.
    pub outbound_fence_header: Option<String>,
    /// `[plugin.limits]`.
    pub limits: Limits,
    /// `[plugin.settings]`.
    pub settings: BTreeMap<String, Setting>,
}

/// One `[[schedule]]`: a job producer asked for a plan every `interval`
/// on one node of `pool`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleConfig {
    /// `name`: the schedule's name in its pool.
    pub name: String,
    /// `path` of the producer component: a file (resolved against the
    /// config file's folder) or a registry reference, with `verify`.
    pub source: Source,
    /// `pool` whose jobs the plans start and stop.
    pub pool: String,
    /// `interval` between plans.
    pub interval: Duration,
    /// `allowed_outbound_hosts` of the producer.
    pub allowed_outbound_hosts: Vec<String>,
    /// `outbound_ca_file` of the producer.
    pub outbound_ca_file: Option<PathBuf>,
    /// `[schedule.limits]` of each plan call.
    pub limits: Limits,
    /// `[schedule.settings]`.
    pub settings: BTreeMap<String, Setting>,
}

/// Where a plugin's or producer's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file.
    File(PathBuf),
    /// `oci://…`: pulled into `runtime.cache_dir` (which config checks
    /// is set) and checked against its digest.
    Registry {
        /// The reference (by digest, or by tag with `allow_tags = true`).
        reference: pulse_oci::Reference,
        /// `verify = { key = "…" }`: the public key a signature must be
        /// made with; none: no signature is asked for.
        verify: Option<PathBuf>,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Registry { reference, .. } => write!(f, "{reference}"),
        }
    }
}

/// `isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// `"job"`.
    Job,
    /// `"worker"`.
    Worker,
}

/// `upgrade`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// `"rolling"`: a host bringing another file of the same plugin joins
    /// the pool, whose workers then run either release until every host
    /// has the new one.
    Rolling,
    /// `"refuse"`: a host bringing another file than the one the pool
    /// recorded is refused.
    Refuse,
}

/// `[plugin.limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `memory`, bytes.
    pub memory: u64,
    /// `call_timeout`.
    pub call_timeout: Duration,
    /// `fuel`.
    pub fuel: Option<u64>,
    /// `instances`: the instances of this plugin live at once on this
    /// host, at most (its share of `runtime.max_instances`).
    pub instances: u32,
    /// `http_connect_timeout`.
    pub http_connect_timeout: Duration,
    /// `http_first_byte_timeout` (also between two parts of a body).
    pub http_first_byte_timeout: Duration,
    /// `http_request_bytes`: the largest body of a request a plugin sends.
    pub http_request_bytes: u64,
    /// `http_response_bytes`.
    pub http_response_bytes: u64,
    /// `http_requests` in flight per instance.
    pub http_requests: u32,
}

/// A configuration that could not be loaded: every problem, each with its
/// line.
#[derive(Debug, thiserror::Error)]
#[error("{}", render(path, problems))]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, in file order.
    pub problems: Vec<Problem>,
}

/// One problem of a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The line (from 1), when known.
    pub line: Option<usize>,
    /// What is wrong and what is allowed.
    pub message: String,
}

fn render(path: &Path, problems: &[Problem]) -> String {
    let mut out = format!("invalid configuration {} ({} problem(s)):", path.display(), problems.len());
    for problem in problems {
        match problem.line {
            Some(line) => out.push_str(&format!("\n  {}:{line}: {}", path.display(), problem.message)),
            None => out.push_str(&format!("\n  {}: {}", path.display(), problem.message)),
        }
    }
    out
}

/// Reads and validates `path`.
///
/// # Errors
/// [`ConfigError`] with every problem found.
pub fn load(path: &Path, defaults: &Defaults) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError {
        path: path.to_owned(),
        problems: vec![Problem { line: None, message: format!("cannot read the file: {error}") }],
    })?;
    parse(path, &text, defaults)
}

/// Validates `text` as if read from `path`; keys it leaves out take
/// their value from `defaults`.
///
/// # Errors
/// [`ConfigError`] with every problem found.
pub fn parse(path: &Path, text: &str, defaults: &Defaults) -> Result<Config, ConfigError> {
    // Absolute, so paths resolved against its folder stay valid whatever
    // the working directory of whoever uses them (redis-server changes its
    // own to its data directory).
    let path = &std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let fail = |problems| ConfigError { path: path.to_owned(), problems };
    let raw: raw::File = toml::from_str(text).map_err(|error| {
        let line = error.span().map(|span| line_of(text, span.start));
        fail(vec![Problem { line, message: error.message().to_owned() }])
    })?;
    let base = path.parent().map(Path::to_owned).unwrap_or_default();
    raw.validate(&base, text, defaults)
        .map(|mut config| {
            config.path = path.to_owned();
            config
        })
        .map_err(fail)
}

/// Whether `token` may serve as the HTTP API's token; the error says
/// what is allowed ("must be …").
///
/// # Errors
/// What a token must be.
pub fn check_token(token: &str) -> Result<(), &'static str> {
    if token.len() >= 16 && token.len() <= 4096 && token.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err("must be 16 to 4,096 printable ASCII characters, without spaces")
    }
}

/// The line (from 1) of byte `offset` of `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1
}
