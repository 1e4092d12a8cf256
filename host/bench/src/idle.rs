//! The `idle` scenario: how long one dispatch takes into a pool that has
//! been idle.
//!
//! Two hosts (the host's own `run`, each serving the `echo` plugin with 4
//! workers and its HTTP API) form one pool. Each round waits 10 s with no
//! traffic, then dispatches two jobs at once: one through a client-only
//! node of this process, one as a `POST` to the first host's API. Idle
//! readers must not be deaf: a blocking read that timed out on the client
//! side, and backed off, used to delay such a dispatch by seconds.
//! Reported per path: p50 and max latency of a confirmed start. Target:
//! max ≤ 50 ms. Then the `pipelined` line: 8 `GET /healthz` written at
//! once on one connection to the API, 20 rounds, each timed until every
//! answer arrived (a server that leaves Nagle on answers the second
//! after the client's delayed acknowledgement: 40 ms).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{Node, NodeOptions};

use crate::Args;
use crate::dispatch::{
    Dispatcher, Handler, Lane, PAYLOAD, WORKERS, free_address, spawn_host, wait_for_workers,
};
use crate::report::{self, percentile};

type BenchResult = Result<(), Box<dyn std::error::Error>>;

const IDLE: Duration = Duration::from_secs(10);
const ROUNDS: usize = 5;
const TARGET: Duration = Duration::from_millis(50);

/// Requests written at once on one connection, per round of the
/// pipelined line.
const PIPELINED: usize = 8;

/// The pipelined line: 20 rounds of [`PIPELINED`] `GET /healthz` written
/// at once on one connection to `api`, each timed until every answer has
/// arrived.
fn pipelined(api: std::net::SocketAddr) -> Result<Vec<Duration>, std::io::Error> {
    use std::io::{Read, Write};
    let mut connection = std::net::TcpStream::connect(api)?;
    connection.set_nodelay(true)?;
    connection.set_read_timeout(Some(Duration::from_secs(10)))?;
    let requests = b"GET /healthz HTTP/1.1\r\nhost: bench\r\n\r\n".repeat(PIPELINED);
    let mut samples = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        connection.write_all(&requests)?;
        let (mut received, mut buffer) = (Vec::new(), [0; 16 << 10]);
        while answers(&received) < PIPELINED {
            let read = connection.read(&mut buffer)?;
            if read == 0 {
                let text = String::from_utf8_lossy(&received).into_owned();
                return Err(std::io::Error::other(format!("the API closed the connection after {text:?}")));
            }
            received.extend_from_slice(&buffer[..read]);
        }
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// How many whole answers (head and `content-length` bytes of body)
/// `received` holds.
fn answers(mut received: &[u8]) -> usize {
    let mut whole = 0;
    while let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if received.len() < end + 4 + length {
            break;
        }
        whole += 1;
        received = &received[end + 4 + length..];
    }
    whole
}

pub fn run(args: &Args) -> BenchResult {
    let (idle, rounds) = if args.quick { (Duration::from_secs(2), 2) } else { (IDLE, ROUNDS) };
    let server = pulse_testkit::RedisServer::start();
    let url = server.url().to_owned();
    let pool = "bench-idle";
    let config_dir = tempfile::tempdir()?;
    let api = free_address()?;
    let mut hosts = Vec::new();
    for (i, address) in [Some(api), Some(free_address()?)].into_iter().enumerate() {
        let dir = config_dir.path().join(i.to_string());
        std::fs::create_dir_all(&dir)?;
        hosts.push(spawn_host(&url, pool, Handler::EchoHttp, 0, address, &dir)?);
    }
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        let node = Arc::new(Node::client(&client, pool, NodeOptions::default()).await?);
        wait_for_workers(&node, 2 * WORKERS, &mut hosts).await?;
        let mut by_node = Dispatcher::Node(node.clone()).lane().await?;
        let mut by_http = Dispatcher::http(api, pool, false).await?.lane().await?;
        let (mut node_samples, mut http_samples) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            tokio::time::sleep(idle).await;
            let timed = async |dispatcher: &mut Lane, key: String| {
                let started = Instant::now();
                let ok = dispatcher.started(&key, &PAYLOAD).await;
                (ok, started.elapsed())
            };
            let ((node_ok, node_took), (http_ok, http_took)) = tokio::join!(
                timed(&mut by_node, format!("node-{round}")),
                timed(&mut by_http, format!("http-{round}")),
            );
            if !node_ok || !http_ok {
                return Err(format!("round {round}: a dispatch was not confirmed").into());
            }
            node_samples.push(node_took);
            http_samples.push(http_took);
        }
        for (path, samples) in [("node", &mut node_samples), ("http", &mut http_samples)] {
            let max = samples.iter().max().copied().unwrap_or_default();
            report::Result::new("idle")
                .field("path", path)
                .field("hosts", 2)
                .millis("idle_ms", idle)
                .field("dispatches", samples.len())
                .millis("p50_ms", percentile(samples, 50.0))
                .millis("max_ms", max)
                .millis("target_ms", TARGET)
                .print();
        }
        let mut pipelined = tokio::task::spawn_blocking(move || pipelined(api)).await??;
        let max = pipelined.iter().max().copied().unwrap_or_default();
        report::Result::new("idle")
            .field("path", "pipelined")
            .field("requests", PIPELINED)
            .field("rounds", pipelined.len())
            .millis("p50_ms", percentile(&mut pipelined, 50.0))
            .millis("max_ms", max)
            .millis("target_ms", TARGET)
            .print();
        // The hosts exit once their pool is shut down.
        node.shutdown(Duration::from_secs(60)).await?;
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    for mut host in hosts {
        drop(host.stdin.take());
        if result.is_err() {
            let _ = host.kill();
        }
        let _ = host.wait();
    }
    result
}
