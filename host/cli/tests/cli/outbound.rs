//! Plugins calling HTTP in a running pool: the `fetcher` example against a
//! server on loopback, across a host killed with SIGKILL.

use std::collections::HashMap;

use pulse_testkit::plugins::FETCHER;
use pulse_testkit::{HttpServer, RedisServer};

use crate::{Host, cli, eventually, job_workers, wait_for_workers, write_config};

const JOBS: usize = 20;

/// Each job's emitted payloads, in order.
fn emitted(config: &std::path::Path, redis: Option<&str>) -> HashMap<String, Vec<String>> {
    crate::emitted(config, redis, "fetcher")
}

/// Each job's worker.
fn workers(config: &std::path::Path, redis: Option<&str>) -> HashMap<String, String> {
    job_workers(config, redis, "fetcher").into_iter().collect()
}

/// Two hosts serving `fetcher` (lease 1 s), each with one worker, and
/// [`JOBS`] jobs `e0`… polling `/e0`… of `endpoints` every 100 ms.
struct TwoHosts {
    endpoints: HttpServer,
    config: std::path::PathBuf,
    first: Host,
    second: Host,
    /// The first host's worker.
    first_worker: String,
    // Dropped last: the hosts are killed first.
    _dir: tempfile::TempDir,
    server: RedisServer,
}

impl TwoHosts {
    fn start() -> Self {
        let endpoints = HttpServer::start();
        for i in 0..JOBS {
            endpoints.set(&format!("/e{i}"), format!("body {i}").as_bytes());
        }
        let server = RedisServer::start();
        let redis = Some(server.url());
        let dir = tempfile::tempdir().unwrap();
        let plugin = format!("allowed_outbound_hosts = [\"http://{}\"]", endpoints.address());
        let config =
            write_config(dir.path(), &[("fetcher", FETCHER, &plugin)], "[node]\nlease_ttl = \"1s\"\n");
        let first = Host::start(&config, redis);
        wait_for_workers(&config, redis, "fetcher", 1);
        let second = Host::start(&config, redis);
        wait_for_workers(&config, redis, "fetcher", 2);
        for i in 0..JOBS {
            let payload = format!("{} 100", endpoints.url(&format!("/e{i}")));
            let (code, out) = cli(
                &config,
                redis,
                &["dispatch", "--pool", "fetcher", &format!("e{i}"), "--payload", &payload],
            );
            assert_eq!((code, out.as_str()), (0, "started"), "e{i}");
        }
        let listed = cli(&config, redis, &["workers", "--pool", "fetcher", "--json"]).1;
        let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
        let first_worker = listed[0]["id"].as_str().unwrap().to_owned();
        Self { endpoints, config, first, second, first_worker, _dir: dir, server }
    }

    fn redis(&self) -> Option<&str> {
        Some(self.server.url())
    }

    /// The jobs the first host runs.
    fn first_host_jobs(&self) -> Vec<String> {
        let jobs = workers(&self.config, self.redis());
        let on_first: Vec<String> =
            jobs.into_iter().filter(|(_, w)| *w == self.first_worker).map(|(k, _)| k).collect();
        assert!(!on_first.is_empty() && on_first.len() < JOBS, "jobs spread over both hosts");
        on_first
    }

    /// Shuts the pool down; the second host exits.
    fn shut_down(self) {
        let (code, out) = cli(&self.config, self.redis(), &["shutdown", "--pool", "fetcher"]);
        assert_eq!(code, 0, "{out}");
        let Self { second, first, .. } = self;
        assert_eq!(second.wait("the shutdown of its only pool"), 0);
        drop(first);
    }
}

#[test]
fn fetcher_jobs_moved_by_kill_9_poll_on_without_emitting_an_unchanged_body_again() {
    let mut pool = TwoHosts::start();
    let (config, redis) = (pool.config.clone(), Some(pool.server.url().to_owned()));
    let redis = redis.as_deref();
    let moved = pool.first_host_jobs();
    eventually("every job emitted its body", || emitted(&config, redis).len() == JOBS);

    pool.first.child.kill().unwrap();
    pool.first.child.wait().unwrap();
    let first_worker = pool.first_worker.clone();
    eventually("every job runs on the surviving host", || {
        let now = workers(&config, redis);
        now.len() == JOBS && now.values().all(|w| !w.is_empty() && *w != first_worker)
    });
    // Polling goes on where they run now: a few more requests each.
    let endpoints = &pool.endpoints;
    let counted: HashMap<String, usize> =
        moved.iter().map(|key| (key.clone(), endpoints.count(&format!("/{key}")))).collect();
    eventually("the moved jobs poll again", || {
        moved.iter().all(|key| endpoints.count(&format!("/{key}")) >= counted[key] + 3)
    });
    let events = emitted(&config, redis);
    for i in 0..JOBS {
        assert_eq!(
            events[&format!("e{i}")],
            vec![format!("200 body {i}")],
            "e{i} emitted an unchanged body again"
        );
    }
    // And a change is still seen, once.
    let changed = &moved[0];
    endpoints.set(&format!("/{changed}"), b"changed");
    eventually("the change is emitted", || emitted(&config, redis)[changed].len() == 2);
    assert_eq!(emitted(&config, redis)[changed][1], "200 changed");
    pool.shut_down();
}

/// The `X-Fetcher-Run` of a request.
fn run_of(request: &pulse_testkit::http::Received) -> String {
    request
        .headers
        .iter()
        .find(|(name, _)| name == "x-fetcher-run")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[test]
fn a_host_frozen_beyond_its_lease_sends_no_request_for_the_jobs_it_lost_once_resumed() {
    let pool = TwoHosts::start();
    let (config, redis) = (pool.config.clone(), Some(pool.server.url().to_owned()));
    let redis = redis.as_deref();
    let (endpoints, frozen_worker) = (&pool.endpoints, pool.first_worker.clone());
    let lost = pool.first_host_jobs();
    eventually("every job polled twice", || (0..JOBS).all(|i| endpoints.count(&format!("/e{i}")) >= 2));
    // The runs of the jobs the frozen host holds, as the endpoints saw them.
    let paths: Vec<String> = lost.iter().map(|key| format!("/{key}")).collect();
    let stale: std::collections::HashSet<String> =
        endpoints.received().iter().filter(|r| paths.contains(&r.path)).map(run_of).collect();

    let pid = pool.first.child.id().to_string();
    std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    eventually("the frozen host's jobs run on the other host and poll there", || {
        let now = workers(&config, redis);
        let moved = now.len() == JOBS && now.values().all(|w| !w.is_empty() && *w != frozen_worker);
        let received = endpoints.received();
        moved
            && paths
                .iter()
                .all(|path| received.iter().any(|r| r.path == *path && !stale.contains(&run_of(r))))
    });
    let resumed_at = endpoints.received_count();
    std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    // Long enough for the resumed host's overdue timers (every 100 ms) to
    // have fired many times: it rejoins and takes jobs again, each polled
    // three more times.
    wait_for_workers(&config, redis, "fetcher", 2);
    let counted: Vec<usize> = paths.iter().map(|path| endpoints.count(path)).collect();
    eventually("every lost job polled three more times", || {
        paths.iter().zip(&counted).all(|(path, before)| endpoints.count(path) >= before + 3)
    });
    let after: Vec<_> =
        endpoints.received().into_iter().skip(resumed_at).filter(|r| stale.contains(&run_of(r))).collect();
    assert!(after.is_empty(), "the resumed host sent requests for jobs it had lost: {after:?}");

    pool.shut_down();
}

/// A host that froze with a job's write on its way, and whose job then
/// moved: the write lands after the job's new run wrote, and the service,
/// which keeps the newest fence per job, refuses it. No check inside the
/// host can stop that write (it left before the freeze); the token it
/// carries can. The new run's writes are never refused, and what the
/// plugin reads with `env.fence` is what its requests carry.
#[test]
fn a_write_a_frozen_host_sent_before_its_job_moved_is_refused_by_a_service_that_keeps_the_newest_fence() {
    let endpoints = HttpServer::start();
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let plugin = format!("allowed_outbound_hosts = [\"http://{}\"]", endpoints.address());
    let config = write_config(dir.path(), &[("fetcher", FETCHER, &plugin)], "[node]\nlease_ttl = \"1s\"\n");
    let mut first = Host::start(&config, redis);
    wait_for_workers(&config, redis, "fetcher", 1);
    let second = Host::start(&config, redis);
    wait_for_workers(&config, redis, "fetcher", 2);
    let listed = cli(&config, redis, &["workers", "--pool", "fetcher", "--json"]).1;
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let frozen_worker = listed[0]["id"].as_str().unwrap().to_owned();
    // Jobs that poll once at start (then every hour): one of them runs on
    // the first host.
    for i in 0..8 {
        endpoints.set(&format!("/fenced/w{i}"), b"ok");
        let payload = format!("{} 3600000", endpoints.url(&format!("/fenced/w{i}")));
        let (code, out) =
            cli(&config, redis, &["dispatch", "--pool", "fetcher", &format!("w{i}"), "--payload", &payload]);
        assert_eq!((code, out.as_str()), (0, "started"), "w{i}");
    }
    let key = workers(&config, redis)
        .into_iter()
        .find(|(_, worker)| *worker == frozen_worker)
        .map(|(key, _)| key)
        .expect("a job on the first host");
    let path = format!("/fenced/{key}");
    let notify = |payload: &str| {
        let (code, out) = cli(&config, redis, &["notify", "--pool", "fetcher", &key, "--payload", payload]);
        assert_eq!(code, 0, "{out}");
    };
    let writes = || endpoints.fenced_writes();
    let token_of = |body: &[u8]| writes().iter().find(|w| w.body == body).and_then(|w| w.token);
    notify("one");
    eventually("the first write is judged", || token_of(b"one").is_some());
    let old = token_of(b"one").unwrap();

    // The next write leaves the first host and is kept on its way.
    let arrived = endpoints.count(&path);
    endpoints.hold_next(&path);
    let sending = {
        let (config, redis, key) = (config.clone(), redis.map(str::to_owned), key.clone());
        std::thread::spawn(move || {
            cli(&config, redis.as_deref(), &["notify", "--pool", "fetcher", &key, "--payload", "two"])
        })
    };
    eventually("the second write reached the service", || endpoints.count(&path) > arrived);
    let pid = first.child.id().to_string();
    std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    eventually("the job runs on the other host", || {
        workers(&config, redis).get(&key).is_some_and(|w| !w.is_empty() && *w != frozen_worker)
    });
    notify("three");
    eventually("the new run's write is judged", || writes().iter().any(|w| w.body == b"three"));
    endpoints.release(&path);
    eventually("the held write is judged", || {
        writes().iter().any(|w| w.body == b"two" && w.token == Some(old))
    });
    std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    let _ = sending.join();
    wait_for_workers(&config, redis, "fetcher", 2);

    let new = token_of(b"three").unwrap();
    let writes = writes();
    assert!(new > old, "the new run's token {new} is larger than the old run's {old}");
    let held = writes.iter().find(|w| w.body == b"two" && w.token == Some(old)).expect("the held write");
    assert!(!held.accepted, "the late write of the run that lost the job is refused: {writes:?}");
    assert_eq!(held.fence.as_deref(), Some(format!("fetcher/{key}/{old}").as_str()));
    // The run that owns the job is never refused (a notification its old
    // run did not finish is delivered to it again, and accepted).
    let refused: Vec<_> = writes.iter().filter(|w| !w.accepted).collect();
    assert!(refused.iter().all(|w| w.token == Some(old)), "only the old run is refused: {writes:?}");
    assert!(writes.iter().filter(|w| w.token == Some(new)).all(|w| w.accepted), "{writes:?}");
    // What the plugin read with `env.fence` (its `X-Fetcher-Run`) is the
    // token its requests carry.
    for request in endpoints.received().iter().filter(|r| r.path == path) {
        let fence = request.headers.iter().find(|(name, _)| name == "pulse-fence").map(|(_, v)| v.clone());
        assert_eq!(fence, Some(format!("fetcher/{key}/{}", run_of(request))), "{request:?}");
    }

    let (code, out) = cli(&config, redis, &["shutdown", "--pool", "fetcher"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(second.wait("the shutdown of its only pool"), 0);
    let _ = first.child.kill();
}

/// `GET /metrics` of a host's API at `address`: the text.
fn metrics(address: std::net::SocketAddr) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// The value of the metric line that starts with `name` and holds every
/// label of `labels`, if any.
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit_once(' ')?.1.parse().ok())
}

#[test]
fn requests_sent_and_denied_are_counted_by_plugin_host_and_status() {
    let endpoints = HttpServer::start();
    endpoints.set("/ok", b"fine");
    let elsewhere = HttpServer::start();
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let api = pulse_testkit::free_address().unwrap();
    let plugin = format!("allowed_outbound_hosts = [\"http://{}\"]", endpoints.address());
    let config =
        write_config(dir.path(), &[("fetcher", FETCHER, &plugin)], &format!("[http]\nlisten = \"{api}\"\n"));
    let host = Host::start(&config, redis);
    wait_for_workers(&config, redis, "fetcher", 1);
    for (key, url) in [("allowed", endpoints.url("/ok")), ("denied", elsewhere.url("/ok"))] {
        let payload = format!("{url} 3600000");
        let (code, out) = cli(&config, redis, &["dispatch", "--pool", "fetcher", key, "--payload", &payload]);
        assert_eq!((code, out.as_str()), (0, "started"), "{key}");
    }
    let text = metrics(api);
    let sent = metric(
        &text,
        "pulse_plugin_http_requests_total",
        &["plugin=\"fetcher\"", "host=\"127.0.0.1\"", "status=\"2xx\""],
    );
    assert_eq!(sent, Some(1.0), "{text}");
    assert_eq!(metric(&text, "pulse_plugin_http_denied_total", &["plugin=\"fetcher\""]), Some(1.0), "{text}");
    assert!(
        metric(&text, "pulse_plugin_http_request_seconds_count", &["plugin=\"fetcher\""]) == Some(1.0),
        "{text}"
    );
    assert_eq!(elsewhere.received_count(), 0);
    // A job polling every 20 ms: its timer's calls are counted with how
    // late they began.
    let payload = format!("{} 20", endpoints.url("/ok"));
    let (code, out) =
        cli(&config, redis, &["dispatch", "--pool", "fetcher", "ticking", "--payload", &payload]);
    assert_eq!((code, out.as_str()), (0, "started"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let ticks =
        |text: &str| metric(text, "pulse_plugin_timer_lateness_seconds_count", &["plugin=\"fetcher\""]);
    let mut text = metrics(api);
    while ticks(&text).is_none_or(|n| n < 3.0) {
        assert!(std::time::Instant::now() < deadline, "no 3 timer calls counted in 60 s: {text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        text = metrics(api);
    }
    // Each within the largest finite bucket (10 s).
    let within = text
        .lines()
        .filter(|line| line.starts_with("pulse_plugin_timer_lateness_seconds_bucket{"))
        .filter(|line| line.contains("plugin=\"fetcher\"") && !line.contains("+Inf"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(within >= 3.0, "{text}");
    drop(host);
}

/// One host serving `fetcher`, and job `key` polling `path` of `endpoints`
/// (which answers `body` there) every `interval_ms`.
struct OneJob {
    endpoints: HttpServer,
    config: std::path::PathBuf,
    _host: Host,
    _dir: tempfile::TempDir,
    server: RedisServer,
}

impl OneJob {
    fn start(key: &str, path: &str, interval_ms: u64) -> Self {
        let endpoints = HttpServer::start();
        endpoints.set(path, b"same body");
        let server = RedisServer::start();
        let redis = Some(server.url());
        let dir = tempfile::tempdir().unwrap();
        let plugin = format!("allowed_outbound_hosts = [\"http://{}\"]", endpoints.address());
        let config = write_config(dir.path(), &[("fetcher", FETCHER, &plugin)], "");
        let host = Host::start(&config, redis);
        wait_for_workers(&config, redis, "fetcher", 1);
        let payload = format!("{} {interval_ms}", endpoints.url(path));
        let (code, out) = cli(&config, redis, &["dispatch", "--pool", "fetcher", key, "--payload", &payload]);
        assert_eq!((code, out.as_str()), (0, "started"));
        Self { endpoints, config, _host: host, _dir: dir, server }
    }
}

#[test]
fn a_job_polling_an_endpoint_reuses_its_connection_and_each_request_carries_its_fence() {
    let job = OneJob::start("kept", "/kept", 50);
    let endpoints = &job.endpoints;
    eventually("the job polled 20 times", || endpoints.count("/kept") >= 20);
    let polls = endpoints.count("/kept");
    // A server may close an idle connection (here it never does), and a
    // request started while the last answer's body is still being read
    // opens another: a few at most, not one per request.
    assert!(endpoints.connections() <= 3, "{} connections for {polls} requests", endpoints.connections());
    let fences: Vec<Option<String>> = endpoints
        .received()
        .iter()
        .map(|r| r.headers.iter().find(|(name, _)| name == "pulse-fence").map(|(_, v)| v.clone()))
        .collect();
    assert!(
        fences.iter().all(|fence| fence.as_deref().is_some_and(|f| f.starts_with("fetcher/kept/"))),
        "every request carries the job's fence: {fences:?}"
    );
}

#[test]
fn a_kept_connection_the_server_closed_is_not_used_again() {
    let job = OneJob::start("a", "/closing/a", 100);
    eventually("the job polled 10 times", || job.endpoints.count("/closing/a") >= 10);
    // Every poll answered: the body once, never an error.
    assert_eq!(
        emitted(&job.config, Some(job.server.url())).get("a"),
        Some(&vec!["200 same body".to_owned()])
    );
    assert!(job.endpoints.connections() >= 10, "a connection per request: the server closed each");
}
