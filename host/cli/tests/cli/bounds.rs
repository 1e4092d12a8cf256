//! A hostile plugin against the host's bounds (docs/limits.md):
//! each misbehaviour stays within its documented limit, the host's memory
//! within its instances' limits plus a constant, and a neighbouring pool
//! keeps working throughout.

use std::time::Instant;

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{ECHO, HOSTILE, SLOW};

use crate::{Host, cli, cli_all, eventually, wait_for_workers, write_config};

/// What the host may hold beyond its instances' memory: its own heap,
/// compiled code, buffers (docs/limits.md).
const HOST_CONSTANT: u64 = 128 << 20;

/// The resident memory of process `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_hostile_plugin_stays_within_every_bound_while_its_neighbour_works() {
    let server = RedisServer::start();
    let redis = server.url();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[("hostile", HOSTILE, "[plugin.limits]\nmemory = \"32MiB\"\ninstances = 8"), ("echo", ECHO, "")],
        "[node]\nevents_max_bytes = \"8MiB\"\n[runtime]\nmax_instances = 16\n",
    );
    let log = dir.path().join("host.log");
    let host = Host::start_logging(&config, Some(redis), &log);
    wait_for_workers(&config, Some(redis), "hostile", 1);
    wait_for_workers(&config, Some(redis), "echo", 1);
    let pid = host.child.id();
    let baseline = rss(pid);
    let neighbour = |key: &str| {
        assert_eq!(cli(&config, Some(redis), &["dispatch", "--pool", "echo", key]), (0, "started".into()));
    };
    let dispatch = |key: &str, payload: &str| {
        cli_all(&config, redis, &["dispatch", "--pool", "hostile", key, "--payload", payload])
    };

    // Timer names: refused before the host keeps one.
    let (code, out, err) = dispatch("names", "timer-names");
    assert_eq!(code, 5, "{out}{err}");
    assert!(out.contains("a timer name may have at most 256 bytes"), "{out}");
    neighbour("n1");

    // Error strings: stored and shown cut, with the marker.
    let (code, out, err) = dispatch("long", "long-error");
    assert_eq!(code, 5);
    assert!(out.len() + err.len() < 8 << 10 && out.contains("[…cut: 8388608 bytes in all]"), "{}", out.len());
    let (code, out, _) = cli_all(&config, redis, &["status", "--pool", "hostile", "long", "--json"]);
    assert_eq!(code, 0);
    assert!(out.len() < 8 << 10, "status printed {} bytes", out.len());
    let (code, out, err) = dispatch("retry", "long-retry");
    assert_eq!(code, 5, "{err}");
    assert!(out.len() < 8 << 10, "{}", out.len());
    neighbour("n2");

    // Logs: cut lines, and each job's rate; the excess is counted and said.
    let before = std::fs::metadata(&log).unwrap().len();
    let flood_started = Instant::now();
    assert_eq!(dispatch("flood", "log-flood").0, 0);
    assert_eq!(dispatch("ticks", "timer-fail").0, 0);
    eventually("the host says it dropped the ticking job's lines", || {
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines().filter(|l| l.contains("log line(s) of this job were dropped")).count() >= 2
    });
    let grown = std::fs::metadata(&log).unwrap().len() - before;
    // Two jobs, each its burst plus its rate for the time elapsed, plus the
    // host's own lines (a few KiB).
    let allowed = 2 * (256 << 10) + 2 * (16 << 10) * (flood_started.elapsed().as_secs() + 1) + (64 << 10);
    assert!(grown <= allowed, "the log grew {grown} bytes; allowed {allowed}");
    neighbour("n3");

    // Events: a pool's stream keeps events_max_bytes of events at most
    // (their netstrings: an event of 1 MiB takes a few bytes more), trimmed
    // to seven eighths of it.
    let (code, out, _) = dispatch("emits", "emit-flood");
    assert_eq!(code, 0, "{out}");
    let mut conn = redis::Client::open(redis).unwrap().get_connection().unwrap();
    let entries: Vec<redis::Value> =
        redis::cmd("XRANGE").arg("pulse:{hostile}:stream:events").arg("-").arg("+").query(&mut conn).unwrap();
    let kept: usize = entries.len();
    assert!((6..=8).contains(&kept), "{kept} events of 1 MiB kept, for events_max_bytes = 8MiB");
    neighbour("n4");

    // Memory: what the live instances may hold, plus a constant.
    let instances = 4; // flood, ticks and emits run; one more may be on its way out
    let bound = baseline + instances * (32 << 20) + HOST_CONSTANT;
    let now = rss(pid);
    assert!(now <= bound, "the host holds {now} bytes; baseline {baseline}, bound {bound}");
    drop(host);
}

#[test]
fn one_pool_cannot_take_the_instances_another_needs() {
    let server = RedisServer::start();
    let redis = server.url();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[("hostile", HOSTILE, ""), ("echo", ECHO, "")],
        "[runtime]\nmax_instances = 4\n",
    );
    let _host = Host::start(&config, Some(redis));
    wait_for_workers(&config, Some(redis), "hostile", 1);
    wait_for_workers(&config, Some(redis), "echo", 1);
    // Each plugin has half of the 4 instances.
    let outcomes: Vec<(i32, String, String)> = (0..4)
        .map(|i| cli_all(&config, redis, &["dispatch", "--pool", "hostile", &format!("h{i}")]))
        .collect();
    let started = outcomes.iter().filter(|(code, _, _)| *code == 0).count();
    assert_eq!(started, 2, "{outcomes:?}");
    let refused = &outcomes.iter().find(|(code, _, _)| *code != 0).unwrap().1;
    assert!(refused.contains("has all of its 2 instances live"), "{refused}");
    for key in ["e1", "e2"] {
        assert_eq!(cli(&config, Some(redis), &["dispatch", "--pool", "echo", key]), (0, "started".into()));
    }
}

#[test]
fn a_plugin_looping_in_stop_delays_leaving_by_shutdown_timeout_at_most() {
    let server = RedisServer::start();
    let redis = server.url();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[(
            "hostile",
            HOSTILE,
            "[plugin.limits]\ncall_timeout = \"10m\"\n[plugin.settings]\nstop = \"loop\"",
        )],
        "[node]\nshutdown_timeout = \"1s\"\n",
    );
    let host = Host::start(&config, Some(redis));
    wait_for_workers(&config, Some(redis), "hostile", 1);
    for i in 0..6 {
        assert_eq!(cli(&config, Some(redis), &["dispatch", "--pool", "hostile", &format!("j{i}")]).0, 0);
    }
    // Six stops of ten minutes each, one after another, would take an hour.
    assert_eq!(host.terminate(), 0);
    // Handed back all the same: queued for the next worker.
    let (code, out) = cli(&config, Some(redis), &["jobs", "--pool", "hostile", "--json"]);
    assert_eq!(code, 0);
    let jobs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let states: Vec<&str> = jobs.as_array().unwrap().iter().map(|j| j["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["queued"; 6], "{out}");
}

/// A call may not outlive the lease it started under. A call still running
/// when its host's lease may have ended (Redis unreachable: paused here) is
/// cut off at once, not left to run beside the job's next run until its
/// `call_timeout`; the notification it served is not lost: the job's next
/// run gets it again.
#[test]
fn a_call_running_when_its_host_s_lease_ends_is_cut_off_and_its_notification_delivered_again() {
    let server = RedisServer::start();
    let redis = server.url();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[("slow", SLOW, "[plugin.limits]\ncall_timeout = \"600s\"")],
        "[node]\nlease_ttl = \"1s\"\n",
    );
    let log = dir.path().join("host.log");
    let host = Host::start_logging(&config, Some(redis), &log);
    wait_for_workers(&config, Some(redis), "slow", 1);
    assert_eq!(cli(&config, Some(redis), &["dispatch", "--pool", "slow", "sleeper"]), (0, "started".into()));
    let notifying = {
        let (config, redis) = (config.clone(), redis.to_owned());
        std::thread::spawn(move || {
            cli(&config, Some(&redis), &["notify", "--pool", "slow", "sleeper", "--payload", "600000"])
        })
    };
    let logged = |text: &str| std::fs::read_to_string(&log).unwrap().matches(text).count();
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + crate::PATIENCE;
        while !done() {
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(Instant::now() < deadline, "timed out waiting until {what}; the host's log:\n{text}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    wait("the call sleeps", &|| logged("sleeping 600000 ms") == 1);
    server.pause();
    wait("the call is cut off", &|| logged("cut off: the job may run elsewhere now") >= 1);
    server.resume();
    wait("the job's next run gets the notification again", &|| logged("sleeping 600000 ms") >= 2);
    drop(host);
    let _ = notifying.join();
}
