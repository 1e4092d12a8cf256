//! Reloading config.toml with SIGHUP. A new release of a plugin rolled
//! through a live pool: two hosts run `counter`, its file is replaced by
//! `counter-v2` and each host gets SIGHUP in turn. Judged from the
//! handlers' side: what each job emitted (its counts) and when each job's
//! `start` and `stop` ran (the hosts' logs). And plugins, workers,
//! schedules and the HTTP token added and removed by a reload.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{COUNTER, COUNTER_V2, ECHO, KEEPER, WRONG_WORLD, path};

use crate::http::Served;
use crate::{Host, cli, eventually, job_workers, wait_for_workers, write_config};

const JOBS: usize = 200;
const LATE_JOBS: usize = 100;

/// Puts `plugin`'s build at `to` the way a deployment would: written
/// beside it, then renamed over it.
pub(crate) fn install(plugin: &str, to: &Path) {
    let staged = to.with_extension("new");
    std::fs::copy(path(plugin), &staged).unwrap();
    std::fs::rename(&staged, to).unwrap();
}

pub(crate) fn sha256(file: &Path) -> String {
    use sha2::Digest as _;
    let hex: String =
        sha2::Sha256::digest(std::fs::read(file).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

pub(crate) fn hang_up(host: &Host) {
    let status = Command::new("kill").args(["-HUP", &host.child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// `rollout --json`: each release's digest with its worker count.
pub(crate) fn releases(config: &Path, redis: Option<&str>) -> Vec<(String, usize)> {
    let (code, out) = cli(config, redis, &["rollout", "--pool", "count", "--json"]);
    assert_eq!(code, 0, "{out}");
    let rollout: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut releases: Vec<(String, usize)> = rollout["releases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["digest"].as_str().unwrap().to_owned(), r["workers"].as_array().unwrap().len()))
        .collect();
    releases.sort();
    releases
}

/// What each job emitted, in order: (release 2?, count).
pub(crate) fn emitted(config: &Path, redis: Option<&str>) -> HashMap<String, Vec<(bool, u64)>> {
    let parse = |payload: &String| {
        let (v2, count) = match payload.strip_prefix("v2 ") {
            Some(count) => (true, count),
            None => (false, payload.as_str()),
        };
        (v2, count.parse().unwrap_or_else(|_| panic!("emitted {payload:?}")))
    };
    let emitted = crate::emitted(config, redis, "count");
    emitted.into_iter().map(|(key, payloads)| (key, payloads.iter().map(parse).collect())).collect()
}

/// Dispatches `keys` with `dispatch --from-file`; every one must start.
pub(crate) fn dispatch_all(config: &Path, redis: Option<&str>, dir: &Path, name: &str, keys: &[String]) {
    let file = dir.join(name);
    let lines: Vec<String> = keys.iter().map(|key| format!("{{\"key\": \"{key}\"}}")).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (code, out) =
        cli(config, redis, &["dispatch", "--pool", "count", "--from-file", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let started = out.lines().filter(|line| line.ends_with(": started")).count();
    assert_eq!(started, keys.len(), "{out}");
}

/// Each job's `start` and `stop` calls from the hosts' logs: (time, host,
/// started?), by key, in time order.
pub(crate) fn calls(logs: &[&Path]) -> HashMap<String, Vec<(String, usize, bool)>> {
    let mut by_job: HashMap<String, Vec<(String, usize, bool)>> = HashMap::new();
    for (host, log) in logs.iter().enumerate() {
        for line in std::fs::read_to_string(log).unwrap().lines() {
            let Some(time) = line.split_whitespace().next() else { continue };
            // counter logs `start <key> at <count>, …` and `stop <key> at …`.
            for (word, started) in [(": start ", true), (": stop ", false)] {
                if let Some(rest) = line.split(word).nth(1)
                    && let Some(key) = rest.split(" at ").next()
                {
                    by_job.entry(key.to_owned()).or_default().push((time.to_owned(), host, started));
                }
            }
        }
    }
    for calls in by_job.values_mut() {
        calls.sort();
    }
    by_job
}

#[test]
fn a_new_release_rolls_through_two_hosts_on_sighup_and_every_job_goes_on_from_its_count() {
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("counter.wasm");
    install(COUNTER, &plugin);
    let config = dir.path().join("config.toml");
    // The pool keeps every event: the checks below read each job's counts
    // from the first, and 300 jobs counting every 300 ms pass the default
    // 10,000 events in about 10 s, which a slow run takes.
    std::fs::write(
        &config,
        format!(
            "[node]\nevents_retention = 1000000\n\
             [[plugin]]\nname = \"count\"\npath = {:?}\nworkers = 2\nupgrade_window = \"2s\"\n\
             [plugin.settings]\ninterval-ms = \"300\"\n",
            plugin.display().to_string()
        ),
    )
    .unwrap();
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let a = Host::start_logging(&config, redis, &log_a);
    wait_for_workers(&config, redis, "count", 2);
    let b = Host::start_logging(&config, redis, &log_b);
    wait_for_workers(&config, redis, "count", 4);
    let v1 = sha256(&plugin);
    let keys: Vec<String> = (0..JOBS).map(|i| format!("c{i}")).collect();
    dispatch_all(&config, redis, dir.path(), "jobs.jsonl", &keys);
    eventually("every job counted to 2", || {
        let emitted = emitted(&config, redis);
        emitted.len() == JOBS && emitted.values().all(|counts| counts.len() >= 2)
    });
    assert_eq!(releases(&config, redis), [(v1.clone(), 4)]);

    // An invalid config is refused with its line; so is a file of another
    // world. The host goes on with v1.
    let refusals =
        || std::fs::read_to_string(&log_a).unwrap().matches("reload refused, still serving").count();
    let valid = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, valid.replace("workers = 2", "workers = \"two\"")).unwrap();
    hang_up(&a);
    eventually("host a refused the invalid config", || refusals() == 1);
    let refused = std::fs::read_to_string(&log_a).unwrap();
    assert!(refused.contains("config.toml:6:"), "the refusal names the line: {refused}");
    std::fs::write(&config, &valid).unwrap();
    install(WRONG_WORLD, &plugin);
    hang_up(&a);
    eventually("host a refused the wrong world", || refusals() == 2);
    let refused = std::fs::read_to_string(&log_a).unwrap();
    assert!(refused.contains("job-handler"), "the refusal names the world it needs: {refused}");
    assert_eq!(releases(&config, redis), [(v1.clone(), 4)]);
    let before = emitted(&config, redis);
    eventually("every job still counts", || {
        let now = emitted(&config, redis);
        before.iter().all(|(key, counts)| now[key].len() > counts.len())
    });

    // v2 on host a, while jobs are dispatched.
    install(COUNTER_V2, &plugin);
    let v2 = sha256(&plugin);
    let late: Vec<String> = (0..LATE_JOBS).map(|i| format!("late{i}")).collect();
    std::thread::scope(|scope| {
        let dispatching = scope.spawn(|| dispatch_all(&config, redis, dir.path(), "late.jsonl", &late));
        hang_up(&a);
        dispatching.join().unwrap();
    });
    eventually("host a's workers run v2", || {
        let mut expected = vec![(v1.clone(), 2), (v2.clone(), 2)];
        expected.sort();
        releases(&config, redis) == expected
    });
    let (code, out) = cli(&config, redis, &["rollout", "--pool", "count"]);
    assert_eq!(code, 0);
    assert!(out.contains("rolling: workers run 2 releases"), "{out}");

    // Then on host b.
    hang_up(&b);
    eventually("every worker runs v2", || releases(&config, redis) == [(v2.clone(), 4)]);
    eventually("every job emits v2's text", || {
        let emitted = emitted(&config, redis);
        emitted.len() == JOBS + LATE_JOBS
            && emitted.values().all(|counts| counts.last().is_some_and(|(v2, _)| *v2))
    });

    // Every job went on from its saved count: never back to 0, no count
    // twice (two workers would emit each count twice), and once on v2
    // never on v1 again.
    for (key, counts) in emitted(&config, redis) {
        assert_eq!(counts[0].1, 1, "{key} started at 1: {counts:?}");
        assert!(counts.windows(2).all(|w| w[0].1 < w[1].1), "{key} counted {counts:?}");
        assert!(counts.windows(2).all(|w| w[0].0 <= w[1].0), "{key} went back to v1: {counts:?}");
    }
    // Each job ran on one worker at a time, and moved once, when its
    // worker was replaced: starts and stops alternate; a job dispatched
    // before the rollout started twice (dispatch, its worker's
    // replacement), one dispatched during host a's reload once or twice.
    let (code, out) = cli(&config, redis, &["shutdown", "--pool", "count"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(a.wait("the pool's shutdown"), 0);
    assert_eq!(b.wait("the pool's shutdown"), 0);
    let calls = calls(&[&log_a, &log_b]);
    assert_eq!(calls.len(), JOBS + LATE_JOBS, "{:?}", calls.keys().take(5).collect::<Vec<_>>());
    for (key, calls) in &calls {
        for (i, (time, host, started)) in calls.iter().enumerate() {
            assert_eq!(*started, i % 2 == 0, "{key}: call {i} at {time} on host {host}: {calls:?}");
        }
        let starts = calls.iter().filter(|(_, _, started)| *started).count();
        let allowed = if key.starts_with("late") { 1..=2 } else { 2..=2 };
        assert!(allowed.contains(&starts), "{key} started {starts} times: {calls:?}");
    }
}

#[tokio::test]
async fn a_reload_adds_and_removes_plugins_workers_and_schedules_and_sets_a_new_token() {
    const TOKEN: &str = "reloaded-token-0123456789";
    let server = RedisServer::start();
    let redis = server.url();
    let dir = tempfile::tempdir().unwrap();
    let write = |plugins: &[(&str, &str, &str)], extra: &str| {
        // Not judged by the upgrade gate: this test is about what a
        // reload changes (the gate has tests of its own).
        let more: Vec<String> =
            plugins.iter().map(|(_, _, more)| format!("{more}\nupgrade_window = \"0s\"")).collect();
        let plugins: Vec<(&str, &str, &str)> = plugins
            .iter()
            .zip(&more)
            .map(|((name, plugin, _), more)| (*name, *plugin, more.as_str()))
            .collect();
        write_config(dir.path(), &plugins, &format!("[http]\nlisten = \"127.0.0.1:0\"\n{extra}"))
    };
    let config = write(&[("echo", ECHO, "")], "");
    let served = Served::start(&config, redis, None).await;
    wait_for_workers(&config, Some(redis), "echo", 1);
    assert_eq!(cli(&config, Some(redis), &["dispatch", "--pool", "echo", "e1"]), (0, "started".into()));
    assert_eq!(served.get("/api/pools").await.0, 200);

    // Added: a worker of echo, a plugin (echo's file under another name),
    // a schedule keeping two jobs of its pool, a token.
    let schedule = format!(
        "token = \"{TOKEN}\"\n[[schedule]]\nname = \"keep\"\npath = {:?}\npool = \"count\"\ninterval = \"100ms\"\n\
         [schedule.settings]\njobs = \"k1,k2\"\n[schedule.limits]\ninstances = 8\n",
        path(KEEPER).display().to_string()
    );
    write(&[("echo", ECHO, "workers = 2"), ("count", ECHO, "")], &schedule);
    hang_up(&served.host);
    wait_for_workers(&config, Some(redis), "echo", 2);
    wait_for_workers(&config, Some(redis), "count", 1);
    eventually("the schedule keeps k1 and k2", || {
        let mut keys: Vec<String> =
            job_workers(&config, Some(redis), "count").into_iter().map(|(k, _)| k).collect();
        keys.sort();
        keys == ["k1", "k2"]
    });
    assert_eq!(served.send("GET", "/api/pools", None, None).await.0, 401, "the new token is required");
    assert_eq!(served.send("GET", "/api/pools", None, Some(TOKEN)).await.0, 200);
    assert_eq!(job_workers(&config, Some(redis), "echo").len(), 1, "e1 is still there");

    // Removed: echo (its job waits for another host).
    write(&[("count", ECHO, "")], &schedule);
    hang_up(&served.host);
    wait_for_workers(&config, Some(redis), "echo", 0);
    eventually("e1 waits for a worker", || {
        let (code, out) = cli(&config, Some(redis), &["status", "--pool", "echo", "e1"]);
        code == 0 && out.contains("queued")
    });
    // Echo's workers were replaced, not only one added: adding a plugin
    // halved echo's share of the runtime's instances, a change of its
    // limits. Removing echo doubled count's. The schedule, whose share is
    // its own (`instances`), went on.
    let log = || std::fs::read_to_string(config.with_file_name("host.log")).unwrap();
    eventually("the second reload is done", || log().contains("summary=upgraded count; removed echo\n"));
    assert!(log().contains("summary=upgraded echo; added count; 1 schedule(s)"), "{}", log());

    // Removed: count, whose node the schedule ran on. The schedule, the
    // same as before, starts again on a client-only node and goes on:
    // a job of its plan that is stopped comes back.
    write(&[], &schedule);
    hang_up(&served.host);
    eventually("the third reload is done", || {
        log().contains("summary=removed count; 2 schedule(s) restarted, started or ended")
    });
    assert_eq!(cli(&config, Some(redis), &["stop", "--pool", "count", "k1"]).0, 0);
    eventually("the schedule dispatches k1 again", || {
        job_workers(&config, Some(redis), "count").iter().any(|(key, _)| key == "k1")
    });
    assert_eq!(served.host.terminate(), 0);
}
