//! The HTTP API of a running host: every route, its successes and each of
//! its error answers, with the token on and off; `/metrics` parsed as
//! Prometheus text; the OpenAPI document checked against what is served.

use std::path::Path;
use std::time::{Duration, Instant};

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{ECHO, SLOW, TRAP};
use serde_json::{Value, json};

use crate::{Host, PATIENCE, write_config};

/// A host with its HTTP API, and a client for it.
pub struct Served {
    pub host: Host,
    pub base: String,
    pub token: Option<String>,
    client: reqwest::Client,
}

impl Served {
    /// Starts `pulse-host run` with this config (its `[http]` must listen
    /// on port 0) and waits until `/readyz` answers 200.
    pub async fn start(config: &Path, redis: &str, token: Option<&str>) -> Self {
        let log = config.with_file_name("host.log");
        let host = Host::start_logging(config, Some(redis), &log);
        let deadline = Instant::now() + PATIENCE;
        let base = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(address) =
                text.split("status page on http://").nth(1).and_then(|rest| rest.split('/').next())
            {
                break format!("http://{address}");
            }
            assert!(Instant::now() < deadline, "the host did not serve HTTP; its log:\n{text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let served = Self { host, base, token: token.map(str::to_owned), client: reqwest::Client::new() };
        let deadline = Instant::now() + PATIENCE;
        while served.get("/readyz").await.0 != 200 {
            assert!(Instant::now() < deadline, "the host did not become ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        served
    }

    /// Sends a request (with the token, if any); returns the status and
    /// the body as JSON (`Value::String` when it is not JSON).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// POSTs `body` with a W3C `traceparent` header.
    pub async fn post_traced(&self, path: &str, body: Value, traceparent: &str) -> (u16, Value) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header("traceparent", traceparent)
            .body(body.to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None, self.token.as_deref()).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, Some(body.to_string().into_bytes()), self.token.as_deref()).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send("DELETE", path, None, self.token.as_deref()).await
    }

    /// Waits until `GET path` answers what `done` accepts.
    pub async fn until(&self, what: &str, path: &str, done: impl Fn(u16, &Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, body) = self.get(path).await;
            if done(status, &body) {
                return body;
            }
            assert!(Instant::now() < deadline, "timed out waiting until {what}; last answer {status} {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `/metrics`, parsed by a Prometheus text-format parser.
    pub async fn metrics(&self) -> prometheus_parse::Scrape {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(self.token.as_deref().unwrap_or(""))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
        let text = response.text().await.unwrap();
        prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap()
    }
}

/// The value of the sample `name` whose labels include `labels`.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

fn outcome(answer: &(u16, Value)) -> (u16, &str) {
    (answer.0, answer.1["outcome"].as_str().or_else(|| answer.1["error"].as_str()).unwrap_or("?"))
}

/// Pools `echo` (2 workers), `trap` (1) and `idle` (no worker here).
fn three_pools(dir: &Path, http: &str) -> std::path::PathBuf {
    write_config(
        dir,
        &[("echo", ECHO, "workers = 2"), ("trap", TRAP, ""), ("idle", ECHO, "pool = \"idle\"\nworkers = 0")],
        &format!("[http]\nlisten = \"127.0.0.1:0\"\n{http}\n"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_answers_its_outcomes_without_a_token() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let api = Served::start(&three_pools(dir.path(), ""), server.url(), None).await;

    // Health, readiness, the document, the page.
    assert_eq!(api.get("/healthz").await, (200, json!({"status": "ok"})));
    assert_eq!(api.get("/readyz").await, (200, json!({"ready": true, "pools": ["echo", "idle", "trap"]})));
    let (status, document) = api.get("/openapi.json").await;
    assert_eq!(status, 200);
    let in_repo: Value = serde_json::from_str(include_str!("../../../../docs/openapi.json")).unwrap();
    assert_eq!(document, in_repo);
    let (status, page) = api.get("/").await;
    assert_eq!(status, 200);
    assert!(page.as_str().unwrap().contains("<title>pulse-host</title>"));

    // Every documented operation is served (neither 405 nor the fallback).
    for (path, operations) in in_repo["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            let concrete = path.replace("{pool}", "echo").replace("{key}", "probe");
            let body = (method == "post").then(|| b"{}".to_vec());
            let (status, answer) = api.send(&method.to_uppercase(), &concrete, body, None).await;
            assert!(
                status != 405 && answer["error"] != "no_such_route",
                "{method} {path}: {status} {answer}"
            );
        }
    }
    assert_eq!(outcome(&api.get("/nothing/here").await), (404, "no_such_route"));
    assert_eq!(outcome(&api.get("/api/pools/nope/jobs").await), (404, "no_such_pool"));
    assert_eq!(outcome(&api.post("/api/pools/nope/jobs", json!({"key": "k"})).await), (404, "no_such_pool"));

    // Dispatch: started, exists, and the refusals of bad input.
    assert_eq!(
        outcome(&api.post("/api/pools/echo/jobs", json!({"key": "a", "payload": "hi"})).await),
        (201, "started")
    );
    let taken = api.post("/api/pools/echo/jobs", json!({"key": "a"})).await;
    assert_eq!((outcome(&taken), &taken.1["state"]), ((409, "exists"), &json!("running")));
    assert_eq!(outcome(&api.post("/api/pools/echo/jobs", json!({"key": ""})).await), (400, "invalid_key"));
    assert_eq!(
        outcome(&api.post("/api/pools/echo/jobs", json!({"key": "a\u{1}"})).await),
        (400, "invalid_key")
    );
    assert_eq!(
        outcome(&api.post("/api/pools/echo/jobs", json!({"key": "b", "colour": 1})).await),
        (400, "invalid_request")
    );
    let both = json!({"key": "b", "payload": "x", "payload_base64": "eA=="});
    assert_eq!(outcome(&api.post("/api/pools/echo/jobs", both).await), (400, "invalid_request"));
    let bad_base64 = json!({"key": "b", "payload_base64": "***"});
    assert_eq!(outcome(&api.post("/api/pools/echo/jobs", bad_base64).await), (400, "invalid_request"));
    let malformed = api.send("POST", "/api/pools/echo/jobs", Some(b"{\"key\":".to_vec()), None).await;
    assert_eq!(outcome(&malformed), (400, "invalid_request"));

    // Status, notify, events, stop.
    let (status, job) = api.get("/api/pools/echo/jobs/a").await;
    assert_eq!((status, &job["state"], job["worker"].is_string()), (200, &json!("running"), true));
    assert_eq!(outcome(&api.get("/api/pools/echo/jobs/missing").await), (404, "no_such_job"));
    let binary = json!({"payload_base64": "AP8="});
    assert_eq!(outcome(&api.post("/api/pools/echo/jobs/a/notify", binary).await), (200, "notified"));
    assert_eq!(
        outcome(&api.post("/api/pools/echo/jobs/a/notify", json!({"payload": "again"})).await),
        (200, "notified")
    );
    assert_eq!(
        outcome(&api.post("/api/pools/echo/jobs/missing/notify", json!({})).await),
        (404, "no_such_job")
    );
    let (status, events) = api.get("/api/pools/echo/events?limit=3").await;
    assert_eq!(status, 200);
    let shown: Vec<_> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].clone(), e["payload"].clone(), e["payload_base64"].clone()))
        .collect();
    assert_eq!(
        shown,
        [
            (json!("a"), json!("again"), Value::Null),
            (json!("a"), Value::Null, json!("AP8=")),
            (json!("a"), json!("hi"), Value::Null)
        ]
    );
    assert_eq!(outcome(&api.get("/api/pools/echo/events?limit=0").await), (400, "invalid_request"));
    assert_eq!(outcome(&api.delete("/api/pools/echo/jobs/a").await), (200, "stopped"));
    assert_eq!(outcome(&api.delete("/api/pools/echo/jobs/a").await), (404, "no_such_job"));

    // The handler's answers: refused, failed, handler error, job failed;
    // then retry and forget of the failed job.
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs", json!({"key": "bad", "payload": "invalid"})).await),
        (422, "refused")
    );
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs", json!({"key": "doomed", "payload": "fail"})).await),
        (424, "failed")
    );
    assert_eq!(outcome(&api.post("/api/pools/trap/jobs", json!({"key": "x"})).await), (201, "started"));
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs/x/notify", json!({"payload": "invalid"})).await),
        (422, "handler_error")
    );
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs/doomed/notify", json!({"payload": "y"})).await),
        (409, "job_failed")
    );
    let failed = api.get("/api/pools/trap/jobs?state=failed").await.1;
    assert_eq!(failed["jobs"][0]["key"], "doomed");
    assert!(failed["jobs"][0]["reason"].as_str().unwrap().contains("failure requested"), "{failed}");
    assert_eq!(outcome(&api.post("/api/pools/trap/jobs/doomed/retry", json!({})).await), (202, "queued"));
    // It fails again (its payload asks for it), and is forgotten.
    api.until("the retried job failed again", "/api/pools/trap/jobs/doomed", |s, j| {
        s == 200 && j["state"] == "failed"
    })
    .await;
    assert_eq!(outcome(&api.post("/api/pools/trap/jobs/doomed/forget", json!({})).await), (200, "forgotten"));
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs/doomed/forget", json!({})).await),
        (404, "no_failed_job")
    );
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs/doomed/retry", json!({})).await),
        (404, "no_failed_job")
    );

    // A pool with no worker alive: queued, then held events.
    assert_eq!(outcome(&api.post("/api/pools/idle/jobs", json!({"key": "later"})).await), (202, "queued"));
    assert_eq!(
        outcome(&api.post("/api/pools/idle/jobs/later/notify", json!({"payload": "p"})).await),
        (202, "held")
    );
    assert_eq!(outcome(&api.delete("/api/pools/idle/jobs/later").await), (202, "held"));

    // Batches: each job's outcome in order; the batch's own limits.
    let batch =
        json!({"jobs": [{"key": "b1"}, {"key": ""}, {"key": "b2", "payload_base64": "AAE="}, {"key": "b1"}]});
    let (status, answer) = api.post("/api/pools/echo/batch", batch).await;
    assert_eq!(status, 200, "{answer}");
    let statuses: Vec<_> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["key"].clone(), r["status"].clone()))
        .collect();
    assert_eq!(
        statuses,
        [
            (json!("b1"), json!(201)),
            (json!(""), json!(400)),
            (json!("b2"), json!(201)),
            (json!("b1"), json!(409))
        ]
    );
    assert_eq!(answer["counts"], json!({"started": 2, "invalid_key": 1, "exists": 1}));
    assert_eq!(
        outcome(&api.post("/api/pools/echo/batch", json!({"jobs": []})).await),
        (400, "invalid_request")
    );
    let too_many: Vec<_> = (0..1001).map(|i| json!({"key": format!("k{i}")})).collect();
    assert_eq!(
        outcome(&api.post("/api/pools/echo/batch", json!({"jobs": too_many})).await),
        (400, "invalid_request")
    );
    // A body that does not fit is refused whole, naming where.
    let (status, answer) =
        api.post("/api/pools/echo/batch", json!({"jobs": [{"key": "fine"}, {"key": 5}]})).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("jobs[1].key"), "{answer}");
    assert_eq!(api.get("/api/pools/echo/jobs/fine").await.0, 404);

    // Paging through the jobs: every job exactly once.
    let many: Vec<_> = (0..40).map(|i| json!({"key": format!("page-{i:02}")})).collect();
    assert_eq!(
        api.post("/api/pools/echo/batch", json!({"jobs": many})).await.1["counts"],
        json!({"started": 40})
    );
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/api/pools/echo/jobs?limit=7&cursor={cursor}"),
            None => "/api/pools/echo/jobs?limit=7".into(),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(page["jobs"].as_array().unwrap().iter().map(|j| j["key"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 42, "40 pages jobs and b1, b2: {seen:?}");
    assert_eq!(outcome(&api.get("/api/pools/echo/jobs?limit=0").await), (400, "invalid_request"));
    assert_eq!(outcome(&api.get("/api/pools/echo/jobs?state=sleeping").await), (400, "invalid_request"));
    assert_eq!(outcome(&api.get("/api/pools/echo/jobs?cursor=abc").await), (400, "invalid_request"));

    // Pools and workers.
    let (status, pools) = api.get("/api/pools").await;
    assert_eq!(status, 200);
    let mut echo = pools["pools"].as_array().unwrap().iter().find(|p| p["name"] == "echo").unwrap().clone();
    let own = echo.as_object_mut().unwrap().remove("node").expect("the host's own node");
    assert_eq!(
        echo,
        json!({"name": "echo", "workers_here": true, "slot_groups": 1, "nodes": 1, "workers": 2, "jobs": {"running": 42, "queued": 0, "failed": 0}, "rollout": null, "refused": []})
    );
    let (status, workers) = api.get("/api/pools/echo/workers").await;
    assert_eq!(status, 200);
    // Its one node is this host's, and says who it is.
    let node = &workers["nodes"][0];
    assert_eq!(node["id"], own);
    assert_eq!(node["pid"], api.host.child.id());
    assert_eq!(node["http"], api.base.as_str());
    assert_eq!(node["version"], env!("CARGO_PKG_VERSION"));
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(node["host"], hostname.trim());
    assert!(node["started_ms"].as_u64().is_some_and(|ms| ms > 1_700_000_000_000), "{node}");
    let jobs: u64 = workers["workers"].as_array().unwrap().iter().map(|w| w["jobs"].as_u64().unwrap()).sum();
    assert_eq!(
        (workers["workers"].as_array().unwrap().len(), jobs, workers["nodes"].as_array().unwrap().len()),
        (2, 42, 1)
    );
    let slots: Vec<u64> =
        workers["workers"].as_array().unwrap().iter().map(|w| w["slots"].as_u64().unwrap()).collect();
    assert_eq!(slots, [2048, 2048], "each worker holds half of the 4,096 virtual slots");

    // Metrics parse, and their counters move.
    let before = api.metrics().await;
    let started = |s: &prometheus_parse::Scrape| {
        sample(s, "pulse_dispatches_total", &[("pool", "echo"), ("outcome", "started")]).unwrap()
    };
    assert_eq!(started(&before), 43.0, "a, b1, b2 and the 40 page jobs");
    assert_eq!(sample(&before, "pulse_jobs", &[("pool", "echo"), ("state", "running")]), Some(42.0));
    assert_eq!(sample(&before, "pulse_jobs", &[("pool", "idle"), ("state", "queued")]), Some(1.0));
    assert_eq!(sample(&before, "pulse_workers", &[("pool", "echo")]), Some(2.0));
    assert_eq!(
        sample(
            &before,
            "pulse_plugin_calls_total",
            &[("plugin", "trap"), ("call", "start"), ("outcome", "guest_error")]
        ),
        Some(3.0)
    );
    assert!(sample(&before, "pulse_plugin_memory_bytes", &[("plugin", "echo")]).unwrap() > 0.0);
    assert!(sample(&before, "pulse_plugin_instantiate_seconds", &[("plugin", "echo")]).unwrap() >= 1.0);
    let dispatches = sample(&before, "pulse_dispatch_seconds", &[("pool", "echo")]).unwrap();
    assert_eq!(
        dispatches, 45.0,
        "every dispatch that reached the pool, whatever its outcome (43 started, 2 taken)"
    );
    assert!(sample(&before, "pulse_lease_renewals_failed_total", &[("pool", "echo")]).is_some());
    assert!(sample(&before, "pulse_evictions_total", &[("pool", "echo")]).is_some());
    assert!(sample(&before, "pulse_rebalances_total", &[("pool", "echo")]).is_some());
    assert!(before.docs.contains_key("pulse_dispatch_seconds"), "HELP lines are there");
    assert_eq!(
        outcome(&api.post("/api/pools/trap/jobs/x/notify", json!({"payload": "trap"})).await),
        (409, "job_failed")
    );
    assert_eq!(
        outcome(&api.post("/api/pools/echo/jobs", json!({"key": "one-more"})).await),
        (201, "started")
    );
    let after = api.metrics().await;
    assert_eq!(started(&after), 44.0);
    assert_eq!(
        sample(
            &after,
            "pulse_plugin_calls_total",
            &[("plugin", "trap"), ("call", "notify"), ("outcome", "trap")]
        ),
        Some(1.0)
    );
    assert_eq!(sample(&after, "pulse_jobs", &[("pool", "trap"), ("state", "failed")]), Some(1.0));
    assert_eq!(api.host.terminate(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_guards_everything_but_health_and_bodies_have_limits() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = "a-long-enough-secret-token";
    let config = write_config(
        dir.path(),
        &[("slow", SLOW, "")],
        &format!(
            "[node]\nmax_jobs = 2\nreply_timeout = \"300ms\"\nmax_payload = \"100B\"\n\n\
             [http]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\nmax_body = \"1KiB\"\n"
        ),
    );
    let api = Served::start(&config, server.url(), Some(token)).await;

    // Health needs no token; the rest answers 401 without it, or with
    // another, and names the header.
    for path in ["/healthz", "/readyz", "/", "/openapi.json"] {
        assert_eq!(api.send("GET", path, None, None).await.0, 200, "{path}");
    }
    for (method, path) in [
        ("GET", "/metrics"),
        ("GET", "/api/pools"),
        ("GET", "/api/pools/slow/jobs"),
        ("DELETE", "/api/pools/slow/jobs/k"),
    ] {
        let (status, answer) = api.send(method, path, None, None).await;
        assert_eq!((status, answer["error"].as_str()), (401, Some("unauthorized")), "{method} {path}");
        assert!(answer["message"].as_str().unwrap().contains("Authorization: Bearer"), "{answer}");
        assert_eq!(
            api.send(method, path, None, Some("not-the-token-at-all")).await.0,
            401,
            "{method} {path}"
        );
    }
    let response = reqwest::get(format!("{}/api/pools", api.base)).await.unwrap();
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_eq!(api.get("/api/pools").await.0, 200);

    // Bodies over http.max_body, and payloads over node.max_payload.
    let huge = json!({"key": "k", "payload": "x".repeat(2000)}).to_string().into_bytes();
    assert_eq!(
        outcome(&api.send("POST", "/api/pools/slow/jobs", Some(huge.clone()), Some(token)).await),
        (413, "body_too_large")
    );
    assert_eq!(
        outcome(&api.send("POST", "/api/pools/slow/jobs/k/notify", Some(huge), Some(token)).await),
        (413, "body_too_large")
    );
    let big = json!({"key": "k", "payload": "x".repeat(200)});
    assert_eq!(outcome(&api.post("/api/pools/slow/jobs", big).await), (413, "payload_too_large"));

    // A start slower than the reply timeout: unconfirmed, then running.
    assert_eq!(
        outcome(&api.post("/api/pools/slow/jobs", json!({"key": "s1", "payload": "1500"})).await),
        (504, "unconfirmed")
    );
    api.until("s1 is listed", "/api/pools/slow/jobs/s1", |s, j| s == 200 && j["state"] == "running").await;
    let notified = api.post("/api/pools/slow/jobs/s1/notify", json!({"payload": "1500"})).await;
    assert_eq!(outcome(&notified), (504, "unconfirmed"));
    // s2 waits behind s1's calls in the worker's inbox: accepted, whether
    // or not its start is confirmed in time.
    let second = api.post("/api/pools/slow/jobs", json!({"key": "s2"})).await;
    assert!(matches!(outcome(&second), (201, "started") | (504, "unconfirmed")), "{second:?}");
    // max_jobs = 2: the pool is full, and says when to come back.
    let response = reqwest::Client::new()
        .post(format!("{}/api/pools/slow/jobs", api.base))
        .bearer_auth(token)
        .json(&json!({"key": "s3"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (response.status().as_u16(), response.headers()["retry-after"].to_str().unwrap().to_owned()),
        (503, "1".to_owned())
    );
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "full");
    let scrape = api.metrics().await;
    assert_eq!(
        sample(&scrape, "pulse_dispatches_total", &[("pool", "slow"), ("outcome", "full")]),
        Some(1.0)
    );
    let unconfirmed =
        sample(&scrape, "pulse_dispatches_total", &[("pool", "slow"), ("outcome", "unconfirmed")]);
    assert!(matches!(unconfirmed, Some(1.0 | 2.0)), "{unconfirmed:?}");
    assert_eq!(api.host.terminate(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_serves_https_with_the_configured_certificate_and_nothing_in_clear() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let server = pulse_testkit::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(names).unwrap();
    std::fs::write(dir.path().join("api.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("api.key"), signing_key.serialize_pem()).unwrap();
    let config = crate::write_config(
        dir.path(),
        &[("echo", pulse_testkit::plugins::ECHO, "")],
        "[http]\nlisten = \"127.0.0.1:0\"\ntls_cert_file = \"api.crt\"\ntls_key_file = \"api.key\"\n",
    );
    let log = dir.path().join("host.log");
    let _host = Host::start_logging(&config, Some(server.url()), &log);
    let deadline = Instant::now() + PATIENCE;
    let address = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(address) =
            text.split("status page on https://").nth(1).and_then(|rest| rest.split('/').next())
        {
            break address.to_owned();
        }
        assert!(Instant::now() < deadline, "the host did not serve HTTPS; its log:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    crate::wait_for_workers(&config, Some(server.url()), "echo", 1);

    // A client that trusts the configured certificate gets the API.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut offers_h2 = client.clone();
    offers_h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut tls = connector.connect(name.clone(), tcp).await.unwrap();
    tls.write_all(
        format!("GET /api/pools HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"name\":\"echo\""), "{answer}");

    // A client that offers HTTP/2 (ALPN) gets it.
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let tls =
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(offers_h2)).connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, _connection) = crate::exposure::http2(hyper_util::rt::TokioIo::new(tls)).await;
    let uri = format!("https://{address}/api/pools");
    let (status, body) = crate::exposure::http2_send(&mut send, "GET", &uri, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("\"name\":\"echo\""), "{body}");

    // Plain HTTP on the same port gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(&address).await.unwrap();
    plain
        .write_all(
            format!("GET /api/pools HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut bytes = Vec::new();
    let _ =
        tokio::time::timeout(PATIENCE, plain.read_to_end(&mut bytes)).await.expect("the server closes it");
    assert!(!bytes.starts_with(b"HTTP/"), "{}", String::from_utf8_lossy(&bytes));
}
