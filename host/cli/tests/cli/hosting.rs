//! A host runs plugins as pool workers; the CLI drives their jobs.

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{COUNTER, ECHO, TRAP};

use crate::{Host, cli, eventually, job_workers, wait_for_workers, write_config};

fn job_state(
    config: &std::path::Path,
    redis: Option<&str>,
    pool: &str,
    key: &str,
) -> Option<serde_json::Value> {
    let (code, out) = cli(config, redis, &["status", "--pool", pool, key, "--json"]);
    (code == 0).then(|| serde_json::from_str(&out).unwrap())
}

#[test]
fn the_cli_dispatches_notifies_lists_and_stops_jobs_of_a_running_host() {
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[("echo", ECHO, "workers = 2\n[plugin.settings]\nprefix = \"> \""), ("trap", TRAP, "")],
        "",
    );
    let host = Host::start(&config, redis);
    wait_for_workers(&config, redis, "echo", 2);
    wait_for_workers(&config, redis, "trap", 1);

    assert_eq!(
        cli(&config, redis, &["dispatch", "--pool", "echo", "greeting", "--payload", "hello"]),
        (0, "started".into())
    );
    assert_eq!(cli(&config, redis, &["dispatch", "--pool", "echo", "greeting"]).0, 3, "a taken key");
    assert_eq!(
        cli(&config, redis, &["notify", "--pool", "echo", "greeting", "--payload", "again"]),
        (0, "notified".into())
    );
    let (code, events) = cli(&config, redis, &["events", "--pool", "echo"]);
    assert_eq!(code, 0);
    assert!(events.contains("greeting: > hello") && events.contains("greeting: > again"), "{events}");

    // A plugin that traps during notify fails its job, with the trap.
    assert_eq!(cli(&config, redis, &["dispatch", "--pool", "trap", "doomed", "--payload", "ok"]).0, 0);
    let (code, out) = cli(&config, redis, &["notify", "--pool", "trap", "doomed", "--payload", "trap"]);
    assert_eq!(code, 5, "{out}");
    let failed = job_state(&config, redis, "trap", "doomed").unwrap();
    assert_eq!(failed["state"], "failed");
    assert!(failed["reason"].as_str().unwrap().contains("unreachable"), "{failed}");
    // The host and the other jobs carry on.
    assert_eq!(cli(&config, redis, &["notify", "--pool", "echo", "greeting", "--payload", "still"]).0, 0);
    let (code, jobs) = cli(&config, redis, &["jobs", "--pool", "trap", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&jobs).unwrap().as_array().unwrap().len(), 1);
    assert_eq!(cli(&config, redis, &["forget", "--pool", "trap", "doomed"]).0, 0);

    let (code, nodes) = cli(&config, redis, &["nodes", "--pool", "echo", "--json"]);
    assert_eq!(code, 0);
    let nodes: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(nodes.as_array().unwrap().len(), 1, "{nodes}");
    assert_eq!(nodes[0]["workers"].as_array().unwrap().len(), 2, "{nodes}");
    // Who the node is: this host's process, without an HTTP API.
    assert_eq!(nodes[0]["pid"], host.child.id(), "{nodes}");
    assert_eq!(nodes[0]["http"], serde_json::Value::Null, "{nodes}");
    let (code, table) = cli(&config, redis, &["nodes", "--pool", "echo"]);
    assert_eq!(code, 0);
    assert!(table.contains(&format!("pid {}", host.child.id())), "{table}");
    let (code, workers) = cli(&config, redis, &["workers", "--pool", "echo", "--json"]);
    assert_eq!(code, 0);
    let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
    assert!(workers.as_array().unwrap().iter().all(|w| w["pid"] == host.child.id()), "{workers}");
    // Its heap grows in 4 KiB pages, not transparent huge pages
    // (host/cli/src/pages.rs), unless mimalloc's variable says otherwise.
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        let status = std::fs::read_to_string(format!("/proc/{}/status", host.child.id())).unwrap();
        assert!(status.contains("THP_enabled:\t0"), "{status}");
    }

    let batch = dir.path().join("jobs.jsonl");
    std::fs::write(
        &batch,
        "{\"key\": \"b1\", \"payload\": \"one\"}\n{\"key\": \"b2\"}\n{\"key\": \"greeting\"}\n",
    )
    .unwrap();
    let (code, out) =
        cli(&config, redis, &["dispatch", "--pool", "echo", "--from-file", batch.to_str().unwrap()]);
    assert_eq!(code, 3, "the taken key decides the exit code: {out}");
    assert_eq!(out, "b1: started\nb2: started\ngreeting: already exists (running)");
    for key in ["b1", "b2"] {
        assert_eq!(cli(&config, redis, &["stop", "--pool", "echo", key]).0, 0);
    }

    assert_eq!(cli(&config, redis, &["stop", "--pool", "echo", "greeting"]), (0, "stopped".into()));
    assert_eq!(cli(&config, redis, &["status", "--pool", "echo", "greeting"]).0, 3);
    assert_eq!(host.terminate(), 0, "SIGTERM: the host leaves and exits 0");
}

#[test]
fn sigterm_hands_jobs_back_and_the_embedded_redis_keeps_them_for_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[("echo", ECHO, "")], "[redis]\ndata_dir = \"data\"\n");
    let host = Host::start(&config, None);
    wait_for_workers(&config, None, "echo", 1);
    assert_eq!(cli(&config, None, &["dispatch", "--pool", "echo", "survivor", "--payload", "kept"]).0, 0);
    assert_eq!(host.terminate(), 0);
    assert!(
        !dir.path().join("data/redis.sock").exists()
            || cli(&config, None, &["jobs", "--pool", "echo"]).0 != 0,
        "the host stopped its private redis-server"
    );

    // The next run finds the job in the append-only file and starts it.
    let host = Host::start(&config, None);
    eventually("the job runs again after the restart", || {
        job_state(&config, None, "echo", "survivor").is_some_and(|job| job["state"] == "running")
    });
    let (_, events) = cli(&config, None, &["events", "--pool", "echo"]);
    assert_eq!(events.matches("survivor: kept").count(), 2, "started once per run: {events}");
    assert_eq!(cli(&config, None, &["stop", "--pool", "echo", "survivor"]).0, 0);
    assert_eq!(host.terminate(), 0);
}

/// Runs `pulse-host run` with `config`, which must exit 1 at once; its
/// standard error.
fn refused_run(config: &std::path::Path, redis: &str) -> String {
    let output = std::process::Command::new(crate::binary())
        .arg("--config")
        .arg(config)
        .args(["--redis", redis, "run"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{err}");
    err
}

#[test]
fn a_host_bringing_another_plugin_to_a_pool_is_refused_with_both_digests() {
    let server = RedisServer::start();
    let redis = Some(server.url());
    let first_dir = tempfile::tempdir().unwrap();
    let first = write_config(first_dir.path(), &[("echo", ECHO, "pool = \"shared\"")], "");
    let host = Host::start(&first, redis);
    wait_for_workers(&first, redis, "shared", 1);

    let second_dir = tempfile::tempdir().unwrap();
    let second = write_config(second_dir.path(), &[("trap", TRAP, "pool = \"shared\"")], "");
    let err = refused_run(&second, server.url());
    assert!(err.contains("pool \"shared\" is served by plugin \"echo\" (sha256 "), "{err}");
    assert!(err.contains("this host brings \"trap\" (sha256 "), "{err}");
    // The refused host left nothing behind: the pool still has one worker.
    wait_for_workers(&first, redis, "shared", 1);

    // Another file of the same plugin is a new release: refused when the
    // host says `upgrade = "refuse"`.
    let third_dir = tempfile::tempdir().unwrap();
    let third =
        write_config(third_dir.path(), &[("echo", COUNTER, "pool = \"shared\"\nupgrade = \"refuse\"")], "");
    let err = refused_run(&third, server.url());
    assert!(err.contains("this plugin has `upgrade = \"refuse\"`"), "{err}");
    wait_for_workers(&first, redis, "shared", 1);
    assert_eq!(host.terminate(), 0);
}

/// The jobs of `pool` as the CLI lists them: key -> worker.

#[test]
fn a_killed_host_s_jobs_run_on_the_other_host_once_it_rejoins_they_spread_and_a_shutdown_stops_both() {
    const JOBS: usize = 200;
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[("echo", ECHO, "workers = 2")], "[node]\nlease_ttl = \"1s\"\n");
    let mut doomed = Host::start(&config, redis);
    wait_for_workers(&config, redis, "echo", 2);
    let survivor = Host::start(&config, redis);
    wait_for_workers(&config, redis, "echo", 4);
    let batch = dir.path().join("jobs.jsonl");
    let lines: Vec<String> = (0..JOBS).map(|i| format!("{{\"key\": \"job-{i}\"}}")).collect();
    std::fs::write(&batch, lines.join("\n")).unwrap();
    let (code, out) =
        cli(&config, redis, &["dispatch", "--pool", "echo", "--from-file", batch.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let (_, workers) = cli(&config, redis, &["workers", "--pool", "echo", "--json"]);
    let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
    let slots: Vec<u64> = workers.as_array().unwrap().iter().map(|w| w["slots"].as_u64().unwrap()).collect();
    assert_eq!(slots, [1024; 4], "four workers share the 4,096 virtual slots evenly");
    let first_two: Vec<String> =
        workers.as_array().unwrap().iter().take(2).map(|w| w["id"].as_str().unwrap().to_owned()).collect();
    let listed = job_workers(&config, redis, "echo");
    assert_eq!(listed.len(), JOBS);
    assert!(listed.iter().any(|(_, worker)| first_two.contains(worker)), "spread over both hosts");

    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    eventually("every job runs on the surviving host", || {
        let jobs = job_workers(&config, redis, "echo");
        jobs.len() == JOBS && jobs.iter().all(|(_, worker)| !worker.is_empty() && !first_two.contains(worker))
    });
    wait_for_workers(&config, redis, "echo", 2);
    // Each job runs once: one notification each, echoed once each.
    for i in 0..JOBS {
        let (code, out) =
            cli(&config, redis, &["notify", "--pool", "echo", &format!("job-{i}"), "--payload", "x"]);
        assert_eq!((code, out.as_str()), (0, "notified"), "job-{i}");
    }
    let (code, events) = cli(&config, redis, &["events", "--pool", "echo"]);
    assert_eq!(code, 0);
    for i in 0..JOBS {
        let echoed = events.lines().filter(|line| line.ends_with(&format!(" job-{i}: x"))).count();
        assert_eq!(echoed, 1, "job-{i}: {echoed} echoes of its notification");
    }

    // The killed host comes back: the pool rebalances over both.
    let back = Host::start(&config, redis);
    wait_for_workers(&config, redis, "echo", 4);
    eventually("jobs run on both hosts again", || {
        let jobs = job_workers(&config, redis, "echo");
        let workers: std::collections::HashSet<&str> = jobs.iter().map(|(_, w)| w.as_str()).collect();
        jobs.len() == JOBS && workers.len() == 4
    });

    let (code, out) = cli(&config, redis, &["shutdown", "--pool", "echo"]);
    assert_eq!((code, out.as_str()), (0, "shut down; the pool held 200 jobs"));
    assert_eq!(survivor.wait("the shutdown of its only pool"), 0);
    assert_eq!(back.wait("the shutdown of its only pool"), 0);
    assert!(job_workers(&config, redis, "echo").is_empty());
}

#[test]
fn a_host_runs_on_as_many_threads_as_its_config_gives() {
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[("echo", ECHO, "workers = 2\n[plugin.settings]\nprefix = \"> \"")],
        "[runtime]\nthreads = 1\n",
    );
    let log = dir.path().join("host.log");
    let host = Host::start_logging(&config, redis, &log);
    wait_for_workers(&config, redis, "echo", 2);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually("the host says it runs", || read_log().contains("running;"));
    // Whatever this machine's cores (and so the default), the host names
    // the count it runs on.
    let line = read_log().lines().find(|line| line.contains("running;")).unwrap().to_owned();
    assert!(line.contains("threads=1"), "{line}");

    // Its jobs run as on any number of threads.
    for key in ["one", "two", "three"] {
        let payload = format!("hello {key}");
        assert_eq!(
            cli(&config, redis, &["dispatch", "--pool", "echo", key, "--payload", &payload]),
            (0, "started".into())
        );
    }
    let (code, events) = cli(&config, redis, &["events", "--pool", "echo"]);
    assert_eq!(code, 0);
    for key in ["one", "two", "three"] {
        assert!(events.contains(&format!("{key}: > hello {key}")), "{events}");
    }
    assert_eq!(host.terminate(), 0);
}
