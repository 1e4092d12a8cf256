//! The `fetch` scenario: plugins calling HTTP at scale.
//!
//! Two host processes (`pulse_host::run`, this program re-run as
//! `serve-host`) serve one pool of the `fetcher` plugin, 2 workers each,
//! in job isolation. 1,000 jobs (`--jobs N`) each poll a loopback server
//! that answers after 20 ms, once a second. After a warm-up the scenario
//! counts the requests the server receives for 10 s: requests per second
//! against the 1,000/s the jobs ask for; the hosts' own latency histogram
//! (`pulse_plugin_http_request_seconds`, from their `/metrics`): mean and
//! the bucket that holds the 99th percentile; each host's resident memory.
//!
//! `fetch http1` (the default) polls a plain HTTP/1.1 server, `fetch
//! http2` an HTTPS server speaking HTTP/2 (the hosts trust its
//! certificate by `outbound_ca_file`): each host then carries its
//! requests over one connection.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{DispatchOutcome, Node, NodeOptions};

use crate::Args;
use crate::dispatch::{end_processes, free_address, spawn_serve_host, wait_for_workers};
use crate::report;

type BenchResult = Result<(), Box<dyn std::error::Error>>;

const POOL: &str = "bench-fetch";
const HOSTS: usize = 2;
const WORKERS_PER_HOST: usize = 2;
const INTERVAL_MS: u64 = 1_000;
const SERVER_MS: u64 = 20;
/// The hosts' histogram of outgoing requests.
const LATENCY: &str = "pulse_plugin_http_request_seconds";

pub fn run(args: &Args) -> BenchResult {
    let named: Vec<&str> = args.rest[1..].iter().map(String::as_str).collect();
    let protocols = if named.is_empty() { vec!["http1"] } else { named };
    for protocol in protocols {
        let endpoints = match protocol {
            "http1" => pulse_testkit::HttpServer::start(),
            "http2" => pulse_testkit::HttpServer::start_h2(),
            other => return Err(format!("fetch takes `http1` or `http2`, got {other:?}").into()),
        };
        line(args, protocol, &endpoints)?;
    }
    Ok(())
}

fn line(args: &Args, protocol: &str, endpoints: &pulse_testkit::HttpServer) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 100 } else { 1_000 });
    let (warm_up, measured) = if args.quick {
        (Duration::from_secs(2), Duration::from_secs(3))
    } else {
        (Duration::from_secs(5), Duration::from_secs(10))
    };
    let redis = pulse_testkit::RedisServer::start();
    let dir = tempfile::tempdir()?;
    let plugin = crate::runtime::plugin_path("fetcher")?;
    let (mut hosts, mut apis) = (Vec::new(), Vec::new());
    for host in 0..HOSTS {
        let api = free_address()?;
        let config = format!(
            "[http]\nlisten = \"{api}\"\n\n[runtime]\nmax_instances = {instances}\n\n\
             [[plugin]]\nname = \"fetcher\"\npath = {path:?}\npool = \"{POOL}\"\nworkers = {WORKERS_PER_HOST}\n\
             isolation = \"job\"\nallowed_outbound_hosts = [{server:?}]\n{ca}",
            instances = jobs + 64,
            path = plugin.display().to_string(),
            server = endpoints.url(""),
            ca = endpoints
                .ca_file()
                .map(|ca| format!("outbound_ca_file = {:?}\n", ca.display().to_string()))
                .unwrap_or_default(),
        );
        let path = dir.path().join(format!("host{host}.toml"));
        std::fs::write(&path, config)?;
        hosts.push(spawn_serve_host(&path, redis.url(), Stdio::null())?);
        apis.push(api);
    }
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = tokio.block_on(async {
        let client = pulse_redis::Redis::open(redis.url())?;
        let node = Arc::new(Node::client(&client, POOL, NodeOptions::default()).await?);
        wait_for_workers(&node, HOSTS * WORKERS_PER_HOST, &mut hosts).await?;
        let started = Instant::now();
        let mut lanes = Vec::new();
        for lane in 0..32 {
            let node = node.clone();
            let url = endpoints.url(&format!("/slow/{SERVER_MS}"));
            lanes.push(tokio::spawn(async move {
                let mut unconfirmed = 0;
                for i in (lane..jobs).step_by(32) {
                    let payload = format!("{url}?job={i} {INTERVAL_MS}");
                    if !matches!(
                        node.dispatch(&format!("f{i}"), payload.as_bytes()).await,
                        Ok(DispatchOutcome::Started)
                    ) {
                        unconfirmed += 1;
                    }
                }
                unconfirmed
            }));
        }
        let mut unconfirmed = 0;
        for lane in lanes {
            unconfirmed += lane.await?;
        }
        let dispatched_in = started.elapsed();
        tokio::time::sleep(warm_up).await;
        let (before, from) = (endpoints.received_count(), Instant::now());
        let scraped_before = crate::scrape::histogram(&apis, LATENCY).await?;
        tokio::time::sleep(measured).await;
        let (after, elapsed) = (endpoints.received_count(), from.elapsed());
        let scraped_after = crate::scrape::histogram(&apis, LATENCY).await?;
        let latency = scraped_after.minus(&scraped_before);
        let rss: Vec<String> = hosts
            .iter()
            .map(|child| report::mib(report::resident_bytes_of(&child.id().to_string())))
            .collect();
        report::Result::new("fetch")
            .field("protocol", protocol)
            .field("jobs", jobs)
            .field("hosts", HOSTS)
            .field("workers", HOSTS * WORKERS_PER_HOST)
            .field("interval_ms", INTERVAL_MS)
            .field("server_ms", SERVER_MS)
            .field("dispatch_s", format!("{:.2}", dispatched_in.as_secs_f64()))
            .field("requests_per_s", format!("{:.0}", (after - before) as f64 / elapsed.as_secs_f64()))
            .field("asked_per_s", format!("{:.0}", jobs as f64 * 1000.0 / INTERVAL_MS as f64))
            .field("mean_ms", format!("{:.1}", latency.mean_ms()))
            .field("p99_le_ms", latency.quantile_field(0.99))
            .field("rss_mib", rss.join("/"))
            .field("server_connections", endpoints.connections())
            .field("unconfirmed", unconfirmed)
            .print();
        node.shutdown(Duration::from_secs(120)).await?;
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    end_processes(hosts, &result);
    result
}
