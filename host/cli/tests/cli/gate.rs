//! The upgrade gate: a bad release of `counter` (`counter-broken`) rolled
//! into a pool of ticking jobs is judged on its first worker, undone by
//! itself and refused by the pool. Judged from the handlers' side: what
//! each job emitted (its counts, and which release emitted them), what the
//! hosts logged of the broken release's calls, and the jobs' states.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{COUNTER, COUNTER_BROKEN, COUNTER_V2, path};

use crate::upgrades::{emitted, hang_up, install, releases, sha256};
use crate::{Host, cli, cli_all, eventually, eventually_within, wait_for_workers};

/// How long the trapping release takes to trap (50 ticks of 200 ms) and
/// be undone, with room for a loaded machine.
const TRAP_PATIENCE: Duration = Duration::from_secs(90);

/// A pool `count` of `counter` ticking every 200 ms, `jobs` jobs.
struct Pool {
    dir: tempfile::TempDir,
    plugin: PathBuf,
    config: PathBuf,
    window: &'static str,
}

impl Pool {
    fn new(extra: &str) -> Self {
        Self::judged_for("20s", extra)
    }

    /// A pool whose plugin's `upgrade_window` is `window`.
    fn judged_for(window: &'static str, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("counter.wasm");
        install(COUNTER, &plugin);
        let config = dir.path().join("config.toml");
        let pool = Pool { dir, plugin, config, window };
        pool.write("", extra);
        pool
    }

    /// Writes the config: `settings` added to the plugin's, `extra` before
    /// the plugin.
    fn write(&self, settings: &str, extra: &str) {
        let text = format!(
            "{extra}\n[[plugin]]\nname = \"count\"\npath = {:?}\nworkers = 2\nupgrade_window = \"{}\"\n\
             [plugin.settings]\ninterval-ms = \"200\"\n{settings}",
            self.plugin.display().to_string(),
            self.window
        );
        std::fs::write(&self.config, text).unwrap();
    }

    /// Starts two hosts of the pool, logging to `log_a` and `log_b`, and
    /// waits for their workers.
    fn two_hosts(&self, redis: Option<&str>, log_a: &Path, log_b: &Path) -> (Host, Host) {
        let a = Host::start_logging(&self.config, redis, log_a);
        wait_for_workers(&self.config, redis, "count", 2);
        let b = Host::start_logging(&self.config, redis, log_b);
        wait_for_workers(&self.config, redis, "count", 4);
        (a, b)
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn dispatch(&self, redis: Option<&str>, jobs: usize) {
        let keys: Vec<String> = (0..jobs).map(|i| format!("c{i}")).collect();
        crate::upgrades::dispatch_all(&self.config, redis, self.dir.path(), "jobs.jsonl", &keys);
        eventually("every job counted to 2", || {
            let emitted = emitted(&self.config, redis);
            emitted.len() == jobs && emitted.values().all(|counts| counts.len() >= 2)
        });
    }

    /// Waits until every job counted `more` times since now, on the first
    /// release (its emits have no `v2 ` prefix).
    fn counting_on_v1(&self, redis: Option<&str>, more: usize, patience: Duration) {
        let before = emitted(&self.config, redis);
        eventually_within("every job counts on the first release again", patience, || {
            let now = emitted(&self.config, redis);
            before.iter().all(|(key, counts)| {
                now[key].len() >= counts.len() + more && now[key][counts.len()..].iter().all(|(v2, _)| !v2)
            })
        });
    }

    /// Every job is running, on its first attempt (no failure counted),
    /// and counted up without going back or counting a number twice.
    fn assert_nothing_lost(&self, redis: Option<&str>) {
        let (code, out) = cli(&self.config, redis, &["jobs", "--pool", "count", "--json"]);
        assert_eq!(code, 0, "{out}");
        let jobs: serde_json::Value = serde_json::from_str(&out).unwrap();
        for job in jobs.as_array().unwrap() {
            assert_eq!(job["state"], "running", "{job}");
            assert_eq!(job["attempt"], 1, "no attempt counted against it: {job}");
        }
        for (key, counts) in emitted(&self.config, redis) {
            assert_eq!(counts[0].1, 1, "{key} started at 1: {counts:?}");
            assert!(counts.windows(2).all(|w| w[0].1 < w[1].1), "{key} counted {counts:?}");
        }
    }
}

fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Waits until host log `log` holds `text`; on a timeout, fails showing
/// the log.
fn until_logged(log: &Path, text: &str, patience: Duration) {
    let deadline = std::time::Instant::now() + patience;
    while !log_text(log).contains(text) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {text:?} in {}:\n{}",
            log.display(),
            log_text(log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_release_that_cannot_read_saved_state_is_undone_by_itself_and_refused_by_the_pool() {
    const JOBS: usize = 40;
    let server = RedisServer::start();
    let redis = Some(server.url());
    let pool = Pool::new("");
    let (log_a, log_b) = (pool.log("a.log"), pool.log("b.log"));
    let (a, b) = pool.two_hosts(redis, &log_a, &log_b);
    pool.dispatch(redis, JOBS);
    let v1 = sha256(&pool.plugin);

    install(COUNTER_BROKEN, &pool.plugin);
    let broken = sha256(&pool.plugin);
    hang_up(&a);
    until_logged(&log_a, "summary=undone", crate::PATIENCE);
    let log = log_text(&log_a);
    // The broken release's `start` ran, and failed, on host a's first
    // worker; those jobs were held, not failed.
    assert!(log.contains("this release cannot read the saved state"), "{log}");
    assert!(log.contains("start held until the worker leaves"), "{log}");
    assert!(log.contains("the new release failed the upgrade gate"), "{log}");
    assert_eq!(releases(&pool.config, redis), [(v1.clone(), 4)]);
    pool.counting_on_v1(redis, 3, crate::PATIENCE);
    pool.assert_nothing_lost(redis);
    assert!(
        emitted(&pool.config, redis).values().flatten().all(|(v2, _)| !v2),
        "the broken release never counted"
    );

    // The pool refuses it: host b does not try it.
    let (code, out) = cli(&pool.config, redis, &["rollout", "--pool", "count", "--json"]);
    assert_eq!(code, 0, "{out}");
    let rollout: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rollout["refused"][0]["digest"], broken.as_str(), "{out}");
    let reason = rollout["refused"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("failed the upgrade gate on host"), "{reason}");
    hang_up(&b);
    until_logged(&log_b, "reload refused", crate::PATIENCE);
    let log = log_text(&log_b);
    assert!(log.contains("refuses release") && log.contains("failed the upgrade gate"), "{log}");
    assert!(!log.contains("start held"), "host b never ran the broken release: {log}");
    assert_eq!(releases(&pool.config, redis), [(v1.clone(), 4)]);

    // Cleared, it may be tried again.
    let (code, _, err) =
        cli_all(&pool.config, server.url(), &["rollout", "--pool", "count", "--clear", "sha256:12"]);
    assert_eq!(code, 1);
    assert!(err.contains("64 hex digits"), "{err}");
    let (code, out) = cli(&pool.config, redis, &["rollout", "--pool", "count", "--clear", &broken]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(&pool.config, redis, &["rollout", "--pool", "count", "--clear", &broken]);
    assert_eq!(code, 3, "{out}");
    let (_, out) = cli(&pool.config, redis, &["rollout", "--pool", "count", "--json"]);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["refused"], serde_json::json!([]));
    pool.assert_nothing_lost(redis);
}

#[test]
fn a_release_that_traps_after_ten_seconds_of_ticking_is_caught_and_its_jobs_go_on_from_their_counts() {
    const JOBS: usize = 30;
    let server = RedisServer::start();
    let redis = Some(server.url());
    let pool = Pool::new("");
    let log = pool.log("host.log");
    let host = Host::start_logging(&pool.config, redis, &log);
    wait_for_workers(&pool.config, redis, "count", 2);
    pool.dispatch(redis, JOBS);
    let v1 = sha256(&pool.plugin);

    install(COUNTER_BROKEN, &pool.plugin);
    pool.write("trap-after-ticks = \"50\"\n", "");
    hang_up(&host);
    eventually_within("the host undid the release", TRAP_PATIENCE, || {
        log_text(&log).contains("summary=undone")
    });
    let text = log_text(&log);
    assert!(text.contains("counter-broken traps at tick 50"), "the release trapped: {text}");
    assert_eq!(releases(&pool.config, redis), [(v1, 2)]);
    pool.counting_on_v1(redis, 3, crate::PATIENCE);
    pool.assert_nothing_lost(redis);
    // The first worker's jobs counted on the broken release for 10 s, then
    // went on from their counts on the first release.
    let emitted = emitted(&pool.config, redis);
    let tried = emitted.values().filter(|counts| counts.iter().any(|(v2, _)| *v2)).count();
    assert!(tried > 0 && tried < JOBS, "{tried} of {JOBS} jobs ran on the broken release");
    for counts in emitted.values().filter(|counts| counts.iter().any(|(v2, _)| *v2)) {
        assert!(counts.iter().filter(|(v2, _)| *v2).count() >= 40, "{counts:?}");
    }
    assert_eq!(host.terminate(), 0);
}

#[test]
fn a_host_killed_while_its_new_release_is_on_trial_loses_no_job() {
    const JOBS: usize = 30;
    let server = RedisServer::start();
    let redis = Some(server.url());
    let node = "[node]\nlease_ttl = \"2s\"\n";
    let pool = Pool::new(node);
    let (log_a, log_b) = (pool.log("a.log"), pool.log("b.log"));
    let (a, _b) = pool.two_hosts(redis, &log_a, &log_b);
    pool.dispatch(redis, JOBS);
    let v1 = sha256(&pool.plugin);

    // A release that traps late, so that it is still on trial.
    install(COUNTER_BROKEN, &pool.plugin);
    pool.write("trap-after-ticks = \"100000\"\n", node);
    hang_up(&a);
    eventually("a job counts on the new release", || {
        emitted(&pool.config, redis).values().any(|counts| counts.last().is_some_and(|(v2, _)| *v2))
    });
    let status = Command::new("kill").args(["-KILL", &a.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    wait_for_workers(&pool.config, redis, "count", 2);
    assert_eq!(releases(&pool.config, redis), [(v1, 2)]);
    pool.counting_on_v1(redis, 3, crate::PATIENCE);
    pool.assert_nothing_lost(redis);
    drop(a);
}

/// `rollout --json`'s announced rollout.
fn announced(pool: &Pool, redis: Option<&str>) -> serde_json::Value {
    let (code, out) = cli(&pool.config, redis, &["rollout", "--pool", "count", "--json"]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["rollout"].clone()
}

#[test]
fn a_release_announced_for_the_pool_goes_through_its_hosts_in_turn_and_is_undone_on_request() {
    const JOBS: usize = 30;
    let server = RedisServer::start();
    let redis = Some(server.url());
    let pool = Pool::judged_for("2s", "");
    let (log_a, log_b) = (pool.log("a.log"), pool.log("b.log"));
    let _hosts = pool.two_hosts(redis, &log_a, &log_b);
    pool.dispatch(redis, JOBS);
    let v1 = sha256(&pool.plugin);
    let rollout = |action: &str, args: &[&str]| {
        let mut all = vec!["rollout", action, "--pool", "count"];
        all.extend_from_slice(args);
        cli_all(&pool.config, server.url(), &all)
    };
    assert_eq!(rollout("pause", &[]).0, 3, "no rollout to pause yet");
    let (code, _, err) = rollout("start", &[]);
    assert_eq!(code, 1);
    assert!(err.contains("`rollout start` needs --file FILE"), "{err}");

    // Announced once, taken by both hosts in turn, no SIGHUP.
    let v2_file = path(COUNTER_V2);
    let v2 = sha256(&v2_file);
    let (code, out, err) = rollout("start", &["--file", v2_file.to_str().unwrap(), "--version", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    eventually("every worker runs the announced release", || {
        releases(&pool.config, redis) == [(v2.clone(), 4)]
    });
    eventually("both hosts said they are done", || {
        let hosts = announced(&pool, redis)["hosts"].clone();
        hosts.as_object().is_some_and(|hosts| hosts.len() == 2 && hosts.values().all(|o| o == "done"))
    });
    for log in [&log_a, &log_b] {
        assert!(log_text(log).contains("this host's turn in the pool's rollout"), "{}", log_text(log));
        assert!(log_text(log).contains("the new release passed the upgrade gate"), "{}", log_text(log));
    }
    eventually("every job counts on the announced release", || {
        emitted(&pool.config, redis).values().all(|counts| counts.last().is_some_and(|(v2, _)| *v2))
    });

    // Undone: both hosts go back to the release they ran before.
    assert_eq!(rollout("undo", &[]).0, 0);
    eventually("every worker runs the first release again", || {
        releases(&pool.config, redis) == [(v1.clone(), 4)]
    });
    pool.counting_on_v1(redis, 3, crate::PATIENCE);
    pool.assert_nothing_lost(redis);

    // A bad release announced: the first host to take it is judged,
    // undoes it and halts the rollout; the other never runs it.
    let broken_file = path(COUNTER_BROKEN);
    let broken = sha256(&broken_file);
    let (code, out, err) = rollout("start", &["--file", broken_file.to_str().unwrap(), "--version", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    eventually("the rollout halted", || announced(&pool, redis)["state"] == "halted");
    let reason = announced(&pool, redis)["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("failed the upgrade gate"), "{reason}");
    let ran = [&log_a, &log_b].iter().filter(|log| log_text(log).contains("start held")).count();
    assert_eq!(ran, 1, "exactly one host ran the bad release");
    assert_eq!(releases(&pool.config, redis), [(v1.clone(), 4)]);
    pool.counting_on_v1(redis, 3, crate::PATIENCE);
    pool.assert_nothing_lost(redis);
    let (code, _, err) = rollout("start", &["--file", broken_file.to_str().unwrap()]);
    assert_eq!(code, 1, "a refused release is not announced again");
    assert!(err.contains(&format!("the pool refuses {broken}")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_shows_a_halted_rollout_and_the_release_the_pool_refuses() {
    let server = RedisServer::start();
    let redis = server.url();
    let pool = Pool::judged_for("10s", "[http]\nlisten = \"127.0.0.1:0\"\n");
    let api = crate::http::Served::start(&pool.config, redis, None).await;
    wait_for_workers(&pool.config, Some(redis), "count", 2);
    tokio::task::block_in_place(|| pool.dispatch(Some(redis), 8));
    let broken_file = path(COUNTER_BROKEN);
    let broken = sha256(&broken_file);
    let args =
        ["rollout", "start", "--pool", "count", "--file", broken_file.to_str().unwrap(), "--version", "3"];
    assert_eq!(cli(&pool.config, Some(redis), &args).0, 0);
    let deadline = std::time::Instant::now() + crate::PATIENCE;
    let count = loop {
        let (status, pools) = api.get("/api/pools").await;
        assert_eq!(status, 200);
        let count = pools["pools"][0].clone();
        if count["rollout"]["state"] == "halted" && !count["refused"].as_array().unwrap().is_empty() {
            break count;
        }
        assert!(std::time::Instant::now() < deadline, "the rollout did not halt: {count}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(count["rollout"]["digest"], broken.as_str());
    assert_eq!(count["rollout"]["version"], "3");
    assert_eq!(count["refused"][0]["digest"], broken.as_str());
    assert!(count["refused"][0]["reason"].as_str().unwrap().contains("failed the upgrade gate"), "{count}");
    assert_eq!(count["rollout"]["hosts"].as_object().unwrap().values().next().unwrap(), "halt", "{count}");
    assert_eq!(count["jobs"]["failed"], 0, "{count}");
    // The status page says so.
    let mut browser = crate::status_page::Browser::launch().await;
    browser.call("Page.navigate", serde_json::json!({"url": api.base})).await;
    browser
        .until(
            "the page shows the halted rollout",
            r#"document.querySelector('[data-rollout="halted"]') !== null"#,
        )
        .await;
    browser
        .until(
            "the page shows the refused release",
            &format!(r#"document.querySelector('[data-refused="{broken}"]')?.innerText.includes("failed the upgrade gate")"#),
        )
        .await;
}

#[test]
fn a_rollout_undone_half_way_leaves_every_host_on_its_first_release() {
    const JOBS: usize = 20;
    let server = RedisServer::start();
    let redis = Some(server.url());
    let pool = Pool::judged_for("3s", "");
    let (log_a, log_b) = (pool.log("a.log"), pool.log("b.log"));
    let _hosts = pool.two_hosts(redis, &log_a, &log_b);
    pool.dispatch(redis, JOBS);
    let v1 = sha256(&pool.plugin);
    let v2_file = path(COUNTER_V2);
    let args = ["rollout", "start", "--pool", "count", "--file", v2_file.to_str().unwrap()];
    assert_eq!(cli(&pool.config, redis, &args).0, 0);
    eventually("a first host took the release", || {
        announced(&pool, redis)["hosts"].as_object().is_some_and(|hosts| hosts.values().any(|o| o == "done"))
    });
    assert_eq!(cli(&pool.config, redis, &["rollout", "undo", "--pool", "count"]).0, 0);
    eventually("every worker runs the first release again", || {
        releases(&pool.config, redis) == [(v1.clone(), 4)]
    });
    eventually("every host that took it says it went back", || {
        let rollout = announced(&pool, redis);
        rollout["state"] == "undoing" && rollout["hosts"].as_object().unwrap().values().all(|o| o == "undone")
    });
    pool.counting_on_v1(redis, 3, crate::PATIENCE);
    pool.assert_nothing_lost(redis);
}
