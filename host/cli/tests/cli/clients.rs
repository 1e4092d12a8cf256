//! Client commands against a pool's Redis: `events` reads every entry up
//! to the newest at the call, `dispatch --from-file` reports what it knows
//! when Redis fails mid-batch and sends nothing when a line is refused,
//! read-only commands leave no trace, a URL of the wrong form is refused
//! before anything is written.

use pulse_testkit::RedisServer;

use crate::{cli, write_config};

#[test]
fn events_without_follow_prints_every_entry_up_to_the_newest() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[], "");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    const EVENTS: usize = 12_345;
    rt.block_on(async {
        let mut conn = server.connect().await;
        // As the pool's emit script writes them: entries n, p, t.
        for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("XADD")
                    .arg(pulse_streams::stream_key("many", "events"))
                    .arg("*")
                    .arg("n")
                    .arg("emit")
                    .arg("p")
                    .arg(format!("payload {i}"))
                    .arg("t")
                    .arg(format!("job-{}", i % 7))
                    .ignore();
            }
            pipe.exec_async(&mut conn).await.unwrap();
        }
    });
    let (code, out) = cli(&config, Some(server.url()), &["events", "--pool", "many", "--json"]);
    assert_eq!(code, 0);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), EVENTS, "every event, once");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["payload"], format!("payload {i}"), "in order");
        assert_eq!(line["key"], format!("job-{}", i % 7));
    }
    // Read-only commands neither join the pool nor leave anything behind.
    let (code, out) = cli(&config, Some(server.url()), &["jobs", "--pool", "many", "--json"]);
    assert_eq!((code, out.as_str()), (0, "[]"));
    rt.block_on(async {
        let mut conn = server.connect().await;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
        assert_eq!(keys, vec![pulse_streams::stream_key("many", "events")]);
    });
}

#[test]
fn dispatch_from_file_prints_outcomes_as_they_come_and_names_the_unknown_ones_when_redis_dies() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    let mut server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[], "");
    const JOBS: usize = 50_000;
    let file = dir.path().join("jobs.jsonl");
    let lines: Vec<String> =
        (0..JOBS).map(|i| format!("{{\"key\": \"job-{i}\", \"payload\": \"p\"}}")).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    // No host serves the pool: each job is answered `queued` at once.
    let mut child = Command::new(crate::binary())
        .arg("--config")
        .arg(&config)
        .args(["--redis", server.url(), "dispatch", "--pool", "batch", "--from-file"])
        .arg(&file)
        .env_remove("PULSE_REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read at once: the keys it names on stderr fill any pipe buffer.
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr_pipe, &mut text).unwrap();
        text
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.ends_with(": queued: no worker is alive; it starts when one joins\n"), "{first:?}");
    // Outcomes arrive while the batch goes on: Redis dies in the middle.
    server.kill();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let stderr = stderr_reader.join().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(7), "stderr: {stderr}");
    let answered: Vec<&str> =
        std::iter::once(first.as_str()).chain(rest.lines()).map(|l| l.split(':').next().unwrap()).collect();
    let unknown: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix("unknown: ")).collect();
    let not_sent: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix("not sent: ")).collect();
    assert!(stderr.contains("is unknown"), "{stderr}");
    assert!(!unknown.is_empty(), "the jobs in flight when Redis died are named: {stderr}");
    // Redis died in the middle: some jobs were never sent. (How many were
    // answered before depends on the machine's speed.)
    assert!(answered.len() + unknown.len() < JOBS, "{} answered", answered.len());
    let mut all: Vec<&str> = answered.iter().chain(&unknown).chain(&not_sent).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), JOBS, "every job is answered, named unknown or named not sent, once");
}

#[test]
fn a_url_of_another_form_than_the_server_is_refused_before_anything_is_written() {
    let server = RedisServer::start_tcp_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[], "");
    let cluster_url = format!("redis+cluster://127.0.0.1:{}/", server.port());
    let (code, _, stderr) =
        crate::cli_all(&config, &cluster_url, &["dispatch", "--pool", "p", "job-1", "--payload", "x"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("not a Redis Cluster") && stderr.contains("redis://host:port"), "{stderr}");
    let (code, _, stderr) =
        crate::cli_all(&config, "redis+sentinel://127.0.0.1:1/", &["jobs", "--pool", "p"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("names its master") && stderr.contains("redis+cluster://"), "{stderr}");
    let mut conn = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn dispatch_from_file_checks_every_line_first_and_sends_nothing_when_one_is_refused() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[], "");
    let file = dir.path().join("jobs.jsonl");
    let long_key = "k".repeat(1 << 20);
    let lines = [
        r#"{"key": "job-1", "payload": "p"}"#.to_owned(),
        r#"{"key": "job-2"}"#.to_owned(),
        format!(r#"{{"key": "{long_key}", "payload": "p"}}"#),
        String::new(),
        r#"{"key": "nul\u0000key", "payload": "p"}"#.to_owned(),
        r#"{"key": "job-6", "payload": "p"}"#.to_owned(),
    ];
    std::fs::write(&file, lines.join("\n")).unwrap();
    let file_arg = file.to_str().unwrap();
    let (code, stdout, stderr) =
        crate::cli_all(&config, server.url(), &["dispatch", "--pool", "refused", "--from-file", file_arg]);
    assert_eq!(code, 1, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.is_empty(), "no job was dispatched: {stdout}");
    assert!(!stderr.contains("unknown"), "a refused line was never sent: {stderr}");
    let refused: Vec<&str> = stderr.lines().filter(|l| l.starts_with("not sent: ")).collect();
    assert_eq!(refused.len(), 2, "each refused line, once: {stderr}");
    let (long, nul) = (refused[0], refused[1]);
    assert!(long.contains(&format!("{file_arg}:3:")) && long.contains("1048576 bytes"), "{long}");
    assert!(nul.contains(&format!("{file_arg}:5:")) && nul.contains("control character"), "{nul}");
    for line in [long, nul] {
        assert!(line.contains("1 to 256 bytes"), "what is allowed: {line}");
        assert!(line.len() < 400, "the key is cut short: {line}");
    }
    assert!(stderr.contains("nothing was sent"), "{stderr}");
    let mut conn = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.is_empty(), "nothing was written: {keys:?}");
}

#[test]
fn jobs_pages_with_a_cursor_and_filters_by_key_prefix_and_state() {
    // More than a hash keeps in one listpack (512 fields), which HSCAN
    // answers whole.
    const JOBS: usize = 1000;
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // No worker: the jobs wait, queued.
    let config = write_config(dir.path(), &[], "");
    let file = dir.path().join("jobs.jsonl");
    let lines: Vec<String> = (0..JOBS).map(|i| format!("{{\"key\": \"k{i}\"}}")).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let redis = Some(server.url());
    let (code, out) =
        cli(&config, redis, &["dispatch", "--pool", "p", "--from-file", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");

    // Pages of about 50, each naming the next one's cursor on stderr.
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = vec!["jobs", "--pool", "p", "--limit", "50", "--json"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor]);
        }
        let (code, out, err) = crate::cli_all(&config, server.url(), &args);
        assert_eq!(code, 0, "{err}");
        let page: serde_json::Value = serde_json::from_str(&out).unwrap();
        let len = page.as_array().unwrap().len();
        assert!(len < JOBS / 4, "about 50 a page, not {len}");
        seen.extend(page.as_array().unwrap().iter().map(|job| job["key"].as_str().unwrap().to_owned()));
        pages += 1;
        match err.split("more jobs: --cursor ").nth(1) {
            Some(next) => cursor = Some(next.trim().to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), JOBS, "every job, over {pages} pages");
    assert!(pages >= 5, "{pages} pages");

    let keys = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["jobs", "--pool", "p", "--json"];
        all.extend_from_slice(args);
        let (code, out) = cli(&config, redis, &all);
        assert_eq!(code, 0, "{out}");
        let jobs: serde_json::Value = serde_json::from_str(&out).unwrap();
        jobs.as_array().unwrap().iter().map(|job| job["key"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(
        keys(&["--prefix", "k29"]),
        ["k29", "k290", "k291", "k292", "k293", "k294", "k295", "k296", "k297", "k298", "k299"]
    );
    assert_eq!(keys(&["--state", "queued", "--prefix", "k1"]).len(), 111);
    assert!(keys(&["--state", "failed"]).is_empty());
    let (code, _, err) =
        crate::cli_all(&config, server.url(), &["jobs", "--pool", "p", "--state", "sleeping"]);
    assert_eq!(code, 1);
    assert!(err.contains("allowed are starting, running, moving, queued, failed"), "{err}");
}
