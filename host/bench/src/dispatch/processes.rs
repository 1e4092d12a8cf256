//! The processes of the `dispatch` scenario: the no-op worker process, the
//! host process, and who dispatches into them.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{DispatchOutcome, HandlerError, Job, JobContext, JobHandler, Node, NodeOptions};

use super::{BenchResult, Handler, STARTUP, WORKERS};
use crate::Args;

/// The hidden scenario name of the no-op worker process.
pub const SERVE_WORKERS: &str = "serve-workers";
/// The hidden scenario name of the plugin worker process.
pub const SERVE_HOST: &str = "serve-host";

/// A handler that accepts everything and does nothing.
struct NoOp;

impl JobHandler for NoOp {
    async fn start(&self, _job: Job, _ctx: JobContext) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        Ok(())
    }
}

pub(super) fn spawn_noop_workers(
    url: &str,
    pool: &str,
    groups: u32,
    workers: usize,
) -> Result<Child, Box<dyn std::error::Error>> {
    crate::process::spawn_ready(&[
        SERVE_WORKERS,
        "--workers",
        &workers.to_string(),
        "--redis",
        url,
        "--pool",
        pool,
        "--groups",
        &groups.to_string(),
    ])
}

/// Who dispatches: a client-only node in this process, or the HTTP API
/// of the host process.
pub(crate) enum Dispatcher {
    Node(Arc<Node>),
    /// The API's routes of one pool: `{base}/jobs`, `{base}/batch`;
    /// over one HTTP/2 connection every lane shares, when `shared` holds
    /// it.
    Http {
        address: std::net::SocketAddr,
        base: String,
        shared: Option<Http2Sender>,
    },
}

impl Dispatcher {
    /// The API at `address`, once it answers ready; over one HTTP/2
    /// connection when `http2` says so.
    pub(crate) async fn http(
        address: std::net::SocketAddr,
        pool: &str,
        http2: bool,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + STARTUP;
        loop {
            let ready = client.get(format!("http://{address}/readyz")).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the host's API at {address} was not ready after {STARTUP:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let shared = if http2 { Some(HttpLane::handshake2(address).await?) } else { None };
        Ok(Self::Http { address, base: format!("/api/pools/{pool}"), shared })
    }

    /// What one lane dispatches through: the node, a keep-alive
    /// connection of its own to the API, or the shared HTTP/2 connection.
    pub(crate) async fn lane(&self) -> Result<Lane, Box<dyn std::error::Error>> {
        match self {
            Self::Node(node) => Ok(Lane::Node(node.clone())),
            Self::Http { address, base, shared } => {
                Ok(Lane::Http(HttpLane::connect(*address, base, shared.clone()).await?))
            }
        }
    }
}

/// One lane's way to dispatch.
pub(crate) enum Lane {
    Node(Arc<Node>),
    Http(HttpLane),
}

impl Lane {
    /// Dispatches `key` with `payload` (ASCII); whether a worker confirmed
    /// its start.
    pub(crate) async fn started(&mut self, key: &str, payload: &[u8]) -> bool {
        match self {
            Self::Node(node) => matches!(node.dispatch(key, payload).await, Ok(DispatchOutcome::Started)),
            Self::Http(http) => {
                let body = serde_json::json!({"key": key, "payload": ascii(payload)});
                http.post("jobs", &body).await.is_some_and(|(status, _)| status == hyper::StatusCode::CREATED)
            }
        }
    }

    /// Dispatches `jobs` (payloads ASCII) as one batch: the pool's
    /// `dispatch_batch`, or `POST …/batch`; how many a worker confirmed.
    pub(crate) async fn started_batch(&mut self, jobs: &[(String, Vec<u8>)]) -> usize {
        match self {
            Self::Node(node) => node
                .dispatch_batch(jobs)
                .await
                .iter()
                .filter(|outcome| matches!(outcome, Ok(DispatchOutcome::Started)))
                .count(),
            Self::Http(http) => {
                let jobs: Vec<_> = jobs
                    .iter()
                    .map(|(key, payload)| serde_json::json!({"key": key, "payload": ascii(payload)}))
                    .collect();
                let Some((_, body)) = http.post("batch", &serde_json::json!({"jobs": jobs})).await else {
                    return 0;
                };
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                body["counts"]["started"].as_u64().unwrap_or(0) as usize
            }
        }
    }
}

fn ascii(payload: &[u8]) -> &str {
    std::str::from_utf8(payload).expect("the payload is ASCII")
}

/// A lane's requests to the API, one at a time: over an HTTP/1.1
/// keep-alive connection of its own, or as streams of a shared HTTP/2
/// one. hyper's client connections without a pool or URL parsing around
/// them, so that the client takes as little as it can of the cores the
/// host shares with it.
pub(crate) struct HttpLane {
    send: Sender,
    address: std::net::SocketAddr,
    host: hyper::header::HeaderValue,
    base: String,
}

type Body = http_body_util::Full<bytes::Bytes>;
pub(crate) type Http2Sender = hyper::client::conn::http2::SendRequest<Body>;

enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Body>),
    Http2(Http2Sender),
}

impl HttpLane {
    async fn connect(
        address: std::net::SocketAddr,
        base: &str,
        shared: Option<Http2Sender>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let send = match shared {
            Some(shared) => Sender::Http2(shared),
            None => Sender::Http1(Self::handshake(address).await?),
        };
        Ok(Self { send, address, host: address.to_string().parse()?, base: base.to_owned() })
    }

    async fn handshake(
        address: std::net::SocketAddr,
    ) -> Result<hyper::client::conn::http1::SendRequest<Body>, Box<dyn std::error::Error>> {
        let stream = tokio::net::TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (send, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(send)
    }

    /// An HTTP/2 connection in clear (prior knowledge).
    async fn handshake2(address: std::net::SocketAddr) -> Result<Http2Sender, Box<dyn std::error::Error>> {
        let stream = tokio::net::TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await?;
        tokio::spawn(connection);
        Ok(send)
    }

    /// `POST {base}/{route}` with `body` as JSON: the answer's status and
    /// body, or `None` when the connection failed.
    async fn post(
        &mut self,
        route: &str,
        body: &serde_json::Value,
    ) -> Option<(hyper::StatusCode, bytes::Bytes)> {
        use http_body_util::BodyExt as _;
        // HTTP/2 names the host in the URI (`:scheme` and `:authority`).
        let request = match self.send {
            Sender::Http1(_) => hyper::Request::post(format!("{}/{route}", self.base))
                .header(hyper::header::HOST, self.host.clone()),
            Sender::Http2(_) => hyper::Request::post(format!("http://{}{}/{route}", self.address, self.base)),
        };
        let request = request
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(serde_json::to_vec(body).ok()?)))
            .ok()?;
        let response = match &mut self.send {
            Sender::Http1(send) => {
                if send.ready().await.is_err() {
                    // The server closed the connection (its idle timeout):
                    // open another, as a pooling client would.
                    *send = Self::handshake(self.address).await.ok()?;
                    send.ready().await.ok()?;
                }
                send.send_request(request).await.ok()?
            }
            Sender::Http2(send) => {
                if send.ready().await.is_err() {
                    // This lane's own connection from now on.
                    *send = Self::handshake2(self.address).await.ok()?;
                    send.ready().await.ok()?;
                }
                send.send_request(request).await.ok()?
            }
        };
        let status = response.status();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    }
}

/// A loopback address for a host started in another process to listen on.
pub(crate) use pulse_testkit::free_address;

/// Starts the host's own `run` in another process, serving the handler's
/// plugin with 4 workers in `pool` (and its HTTP API on `api`).
pub(crate) fn spawn_host(
    url: &str,
    pool: &str,
    handler: Handler,
    jobs: usize,
    api: Option<std::net::SocketAddr>,
    dir: &Path,
) -> Result<Child, Box<dyn std::error::Error>> {
    let name = match handler {
        Handler::Slow | Handler::SlowSerial => "slow",
        _ => "echo",
    };
    let plugin = crate::runtime::plugin_path(name)?;
    let (isolation, max_instances) = match handler.instance_per_job() {
        true => ("job", jobs + WORKERS * 4),
        false => ("worker", WORKERS * 4),
    };
    let calls = match handler {
        Handler::Slow => "max_concurrent_calls = 32\n",
        Handler::SlowSerial => "max_concurrent_calls = 1\n",
        _ => "",
    };
    let http = api.map(|address| format!("[http]\nlisten = \"{address}\"\n\n")).unwrap_or_default();
    let config = format!(
        "{http}[runtime]\nmax_instances = {max_instances}\n\n\
         [[plugin]]\nname = {name:?}\npath = {path:?}\npool = {pool:?}\nworkers = {WORKERS}\nisolation = {isolation:?}\n{calls}",
        path = plugin.display().to_string(),
    );
    let path = dir.join(format!("{pool}.toml"));
    std::fs::write(&path, config)?;
    spawn_serve_host(&path, url, Stdio::piped())
}

/// This program re-run as `serve-host` with the config at `config`.
pub(crate) fn spawn_serve_host(
    config: &Path,
    url: &str,
    stdin: Stdio,
) -> Result<Child, Box<dyn std::error::Error>> {
    let path = config.to_str().ok_or("the temporary directory's path is not UTF-8")?;
    Ok(Command::new(std::env::current_exe()?)
        .args([SERVE_HOST, path, "--redis", url])
        .stdin(stdin)
        .spawn()?)
}

/// Waits for each of `processes` to end; kills them first when the
/// scenario failed (they would wait for a shutdown that never comes).
pub(crate) fn end_processes<T>(processes: Vec<Child>, result: &Result<T, Box<dyn std::error::Error>>) {
    for mut child in processes {
        if result.is_err() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// Waits until the pool lists `count` workers with slots; fails when one
/// of `processes` (the ones serving them) ends first, or after
/// [`STARTUP`].
pub(crate) async fn wait_for_workers(node: &Node, count: usize, processes: &mut [Child]) -> BenchResult {
    let deadline = Instant::now() + STARTUP;
    loop {
        let workers = node.workers().await?;
        if workers.iter().filter(|w| w.slots > 0).count() >= count {
            return Ok(());
        }
        for process in processes.iter_mut() {
            if let Some(status) = process.try_wait()? {
                return Err(format!("a worker process ended before its workers joined: {status}").into());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the pool had no {count} workers after {STARTUP:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The worker process: a full node with 4 no-op workers, until its stdin
/// closes.
pub fn serve_workers(args: &Args) -> BenchResult {
    let url = args.redis.clone().ok_or("serve-workers needs --redis")?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        let pool = args.pool.as_deref().ok_or("serve-workers needs --pool")?;
        let options = NodeOptions { slot_groups: args.groups.unwrap_or(1), ..NodeOptions::default() };
        let node = Node::join(&client, pool, options).await?;
        for _ in 0..args.workers.unwrap_or(WORKERS) {
            node.add_worker(NoOp).await?;
        }
        println!("ready");
        // Blocks until the parent closes our stdin (or dies).
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await?;
        Ok(())
    })
}

/// The plugin worker process: `pulse_host::run` with the config at the
/// path given, until its pool is shut down.
pub fn serve_host(args: &Args) -> BenchResult {
    let url = args.redis.clone().ok_or("serve-host needs --redis")?;
    let path = args.rest.get(1).ok_or("serve-host needs a config path")?;
    let config = pulse_host::defaults::load_config(Path::new(path))?;
    let tokio = pulse_host::run::async_runtime(config.runtime.threads)?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        // `:#`: the reason with its causes (which setting, which limit).
        pulse_host::run::run(&config, &client).await.map_err(|error| format!("{error:#}"))?;
        Ok(())
    })
}
