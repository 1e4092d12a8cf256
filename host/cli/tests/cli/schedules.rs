//! A host running the `keeper` producer's schedule against a pool served
//! by another host: the pool follows the producer's settings.

use std::collections::BTreeMap;
use std::path::Path;

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::{ECHO, KEEPER};

use crate::{Host, cli, eventually, wait_for_workers, write_config};

/// The keys of the pool's jobs.
fn keys(config: &Path, redis: Option<&str>) -> Vec<String> {
    let (code, out) = cli(config, redis, &["jobs", "--pool", "echo", "--json"]);
    assert_eq!(code, 0, "{out}");
    let jobs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut keys: Vec<String> =
        jobs.as_array().unwrap().iter().map(|job| job["key"].as_str().unwrap().to_owned()).collect();
    keys.sort();
    keys
}

/// A config running only the keeper's schedule on pool `echo`.
fn schedule_config(dir: &Path, jobs: &str) -> std::path::PathBuf {
    let path = pulse_testkit::plugins::path(KEEPER);
    write_config(
        dir,
        &[],
        &format!(
            "[[schedule]]\nname = \"keep\"\npath = \"{}\"\npool = \"echo\"\ninterval = \"200ms\"\n\
             [schedule.settings]\njobs = \"{jobs}\"\n",
            path.display()
        ),
    )
}

#[test]
fn a_schedule_converges_the_pool_to_its_producer_s_list_after_each_change() {
    let server = RedisServer::start();
    let redis = Some(server.url());
    let workers_dir = tempfile::tempdir().unwrap();
    let workers_config = write_config(workers_dir.path(), &[("echo", ECHO, "workers = 2")], "");
    let workers = Host::start(&workers_config, redis);
    wait_for_workers(&workers_config, redis, "echo", 2);

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("scheduler.log");
    let mut logs = String::new();
    for (list, expected) in [("a,b", &["a", "b"][..]), ("b,c", &["b", "c"]), ("c,d,e", &["c", "d", "e"])] {
        let config = schedule_config(dir.path(), list);
        let scheduler = Host::start_logging(&config, redis, &log);
        eventually(&format!("the pool runs {expected:?}"), || keys(&workers_config, redis) == expected);
        assert_eq!(scheduler.terminate(), 0);
        logs.push_str(&std::fs::read_to_string(&log).unwrap());
    }

    // Each job started once: `echo` emits its payload on start.
    let (code, out) = cli(&workers_config, redis, &["events", "--pool", "echo", "--json"]);
    assert_eq!(code, 0, "{out}");
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for line in out.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        *starts.entry(event["key"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = ["a", "b", "c", "d", "e"].map(|k| (k.to_owned(), 1)).into();
    assert_eq!(starts, expected, "starts per key");
    // Plans repeated every tick dispatch nothing and log nothing amiss.
    assert!(logs.contains("plan applied"), "{logs}");
    for line in logs.lines() {
        assert!(!line.contains("WARN") && !line.contains("ERROR"), "{line}");
        assert!(!line.contains("already exists"), "{line}");
    }
    assert_eq!(workers.terminate(), 0);
}
