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
//! max ≤ 50 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{Node, NodeOptions};

use crate::Args;
use crate::dispatch::{Dispatcher, Handler, PAYLOAD, WORKERS, free_address, spawn_host, wait_for_workers};
use crate::report::{self, percentile};

type BenchResult = Result<(), Box<dyn std::error::Error>>;

const IDLE: Duration = Duration::from_secs(10);
const ROUNDS: usize = 5;
const TARGET: Duration = Duration::from_millis(50);

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
        let by_node = Dispatcher::Node(node.clone());
        let by_http = Dispatcher::http(api, pool).await?;
        let (mut node_samples, mut http_samples) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            tokio::time::sleep(idle).await;
            let timed = |dispatcher: Dispatcher, key: String| async move {
                let started = Instant::now();
                let ok = dispatcher.started(&key, &PAYLOAD).await;
                (ok, started.elapsed())
            };
            let ((node_ok, node_took), (http_ok, http_took)) = tokio::join!(
                timed(by_node.clone(), format!("node-{round}")),
                timed(by_http.clone(), format!("http-{round}")),
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
