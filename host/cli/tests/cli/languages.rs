//! Plugins written in Python and JavaScript in a running pool: counting
//! jobs (`python-echo` and `js-echo` with `interval-ms`) carry their saved
//! count across a host killed with SIGKILL, as the Rust `counter` does.

use std::collections::HashMap;

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{JS_ECHO, PYTHON_ECHO};

use crate::{
    COMPILE_PATIENCE, Host, cli, eventually, job_workers, wait_for_workers, wait_for_workers_within,
    write_config,
};

const JOBS: usize = 6;

/// Each job's emitted counts, from `events --json`, in order.
fn counts(config: &std::path::Path, redis: Option<&str>) -> HashMap<String, Vec<u64>> {
    let emitted = crate::emitted(config, redis, "count");
    emitted
        .into_iter()
        .map(|(key, payloads)| (key, payloads.iter().map(|p| p.parse().unwrap()).collect()))
        .collect()
}

#[test]
fn python_and_javascript_jobs_resume_their_saved_count_on_another_host_after_a_kill_9() {
    for plugin in [PYTHON_ECHO, JS_ECHO] {
        let server = RedisServer::start();
        let redis = Some(server.url());
        let dir = tempfile::tempdir().unwrap();
        // An interpreter needs room; both hosts share one compilation cache.
        let cache = dir.path().join("cache");
        let settings = "[plugin.settings]\ninterval-ms = \"50\"\n[plugin.limits]\nmemory = \"256MiB\"";
        let extra = format!(
            "[node]\nlease_ttl = \"1s\"\n[runtime]\nmax_memory_per_instance = \"256MiB\"\ncache_dir = {:?}\n",
            cache.display().to_string()
        );
        let config = write_config(dir.path(), &[("count", plugin, settings)], &extra);
        let mut first = Host::start(&config, redis);
        // The first host compiles the interpreter into the shared cache.
        wait_for_workers_within(&config, redis, "count", 1, COMPILE_PATIENCE);
        let second = Host::start(&config, redis);
        wait_for_workers(&config, redis, "count", 2);
        for i in 0..JOBS {
            let (code, out) = cli(&config, redis, &["dispatch", "--pool", "count", &format!("c{i}")]);
            assert_eq!((code, out.as_str()), (0, "started"), "{plugin}: c{i}");
        }
        let listed = cli(&config, redis, &["workers", "--pool", "count", "--json"]).1;
        let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
        let first_worker = listed[0]["id"].as_str().unwrap().to_owned();
        let moved: Vec<String> = job_workers(&config, redis, "count")
            .into_iter()
            .filter(|(_, worker)| *worker == first_worker)
            .map(|(key, _)| key)
            .collect();
        assert!(!moved.is_empty(), "{plugin}: the first host runs some of the jobs");
        eventually("every job counted to 3", || {
            let counts = counts(&config, redis);
            counts.len() == JOBS && counts.values().all(|c| c.len() >= 3)
        });

        first.child.kill().unwrap();
        first.child.wait().unwrap();
        let before = counts(&config, redis);
        eventually("every job runs on the surviving host", || {
            let now = job_workers(&config, redis, "count");
            now.len() == JOBS && now.iter().all(|(_, w)| !w.is_empty() && *w != first_worker)
        });
        eventually("the moved jobs count on", || {
            let now = counts(&config, redis);
            moved.iter().all(|key| now[key].len() >= before[key].len() + 3)
        });
        // Never back to 0: each job's counts only grow, across the move.
        for (key, counted) in counts(&config, redis) {
            assert!(counted.windows(2).all(|w| w[0] < w[1]), "{plugin}: {key} counted {counted:?}");
            assert_eq!(counted[0], 1, "{plugin}: {key} started from 0");
        }
        let (code, out) = cli(&config, redis, &["shutdown", "--pool", "count"]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(second.wait("the shutdown of its only pool"), 0);
    }
}
