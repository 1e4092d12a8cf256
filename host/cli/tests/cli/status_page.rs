//! The status page in a real browser: headless Chromium (Debian's
//! `chromium`, or `PULSE_CHROMIUM`), driven over the Chrome DevTools
//! protocol. The page shows a job dispatched through the API while it
//! refreshes, and drops it once stopped; screenshots of both moments are
//! written to the test's target directory.

use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use pulse_testkit::RedisServer;
use pulse_testkit::plugins::ECHO;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use tokio_tungstenite::tungstenite::Message;

use crate::http::Served;
use crate::{PATIENCE, write_config};

/// A headless Chromium with one page, killed when dropped.
pub(crate) struct Browser {
    _child: tokio::process::Child,
    _profile: tempfile::TempDir,
    page: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    next_id: u64,
}

impl Browser {
    pub(crate) async fn launch() -> Self {
        let binary = std::env::var("PULSE_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start {binary:?} ({error}): install Debian's chromium (.ci/run does) or set PULSE_CHROMIUM")
            });
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let endpoint = tokio::time::timeout(PATIENCE, async {
            loop {
                let line = lines.next_line().await.unwrap().expect("Chromium exited before listening");
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    return url.trim().to_owned();
                }
            }
        })
        .await
        .expect("Chromium did not open its DevTools endpoint");
        // Chromium blocks if nobody reads what it writes.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let address = endpoint.trim_start_matches("ws://").split('/').next().unwrap().to_owned();
        let targets: Value =
            reqwest::get(format!("http://{address}/json/list")).await.unwrap().json().await.unwrap();
        let page_url = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("Chromium opened a page")
            .to_owned();
        let (page, _) = tokio_tungstenite::connect_async(page_url).await.unwrap();
        Self { _child: child, _profile: profile, page, next_id: 0 }
    }

    /// Calls a DevTools method of the page; returns its result.
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"id": id, "method": method, "params": params}).to_string();
        self.page.send(Message::Text(request.into())).await.unwrap();
        loop {
            let message = tokio::time::timeout(PATIENCE, self.page.next())
                .await
                .expect("Chromium did not answer")
                .expect("Chromium closed the page")
                .unwrap();
            let Message::Text(text) = message else { continue };
            let answer: Value = serde_json::from_str(&text).unwrap();
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// Evaluates a JavaScript expression in the page.
    async fn eval(&mut self, expression: &str) -> Value {
        let result =
            self.call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true})).await;
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is true in the page.
    pub(crate) async fn until(&mut self, what: &str, expression: &str) {
        let deadline = Instant::now() + PATIENCE;
        while self.eval(expression).await != Value::Bool(true) {
            if Instant::now() > deadline {
                let text = self.eval("document.body.innerText").await;
                panic!(
                    "timed out waiting until {what}; the page shows:\n{}",
                    text.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes a PNG screenshot of the page to `name` in the test's target
    /// directory; returns its path.
    async fn screenshot(&mut self, name: &str) -> std::path::PathBuf {
        let result = self.call("Page.captureScreenshot", json!({"format": "png"})).await;
        let png = base64::engine::general_purpose::STANDARD.decode(result["data"].as_str().unwrap()).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real picture of the page");
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot of the status page: {}", path.display());
        path
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_shows_a_job_dispatched_through_the_api_until_it_is_stopped() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = "status-page-test-token";
    let config = write_config(
        dir.path(),
        &[("echo", ECHO, "workers = 2")],
        &format!("[http]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n"),
    );
    let api = Served::start(&config, server.url(), Some(token)).await;
    let mut browser = Browser::launch().await;

    // The token comes in the address's fragment, which the page then drops.
    browser.call("Page.navigate", json!({"url": format!("{}/#token={token}", api.base)})).await;
    browser
        .until("the page shows pool echo", r#"document.querySelector('[data-pool="echo"]') !== null"#)
        .await;
    assert_eq!(browser.eval("location.hash").await, "");
    browser.until("both workers are listed", "document.querySelectorAll('[data-worker]').length === 2").await;
    // Their node is named by its machine and process, as this host.
    let pid = api.host.child.id();
    browser
        .until(
            "the workers' node is shown as this host's process",
            &format!(
                r#"[...document.querySelectorAll('[data-node]')].filter(td => td.innerText.includes("pid {pid} (this host)")).length === 2"#
            ),
        )
        .await;

    let dispatched = api
        .post("/api/pools/echo/jobs", json!({"key": "on-the-page", "payload": "hello from the API"}))
        .await;
    assert_eq!(dispatched.0, 201, "{dispatched:?}");
    browser
        .until(
            "the job appears, running",
            r#"document.querySelector('[data-job="on-the-page"]')?.dataset.state === "running""#,
        )
        .await;
    browser
        .until("the plugin's event appears", r#"document.body.innerText.includes("hello from the API")"#)
        .await;
    browser.screenshot("status-page.png").await;

    assert_eq!(api.delete("/api/pools/echo/jobs/on-the-page").await.0, 200);
    browser
        .until(
            "the job is gone from the page",
            r#"document.querySelector('[data-job="on-the-page"]') === null"#,
        )
        .await;
    browser
        .until("the counts say no job runs", r#"document.querySelector('.counts b')?.textContent === "0""#)
        .await;
    browser.screenshot("status-page-after-stop.png").await;
    assert_eq!(api.host.terminate(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_filters_and_pages_jobs_and_acts_on_one_only_once_confirmed() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = "status-page-actions-token";
    let config = write_config(
        dir.path(),
        &[("echo", ECHO, "workers = 2")],
        &format!("[http]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n"),
    );
    let api = Served::start(&config, server.url(), Some(token)).await;
    // More jobs than one page holds (100), and two under a prefix.
    let mut keys: Vec<String> = (0..130).map(|i| format!("bulk-{i:03}")).collect();
    keys.extend(["act-1".to_owned(), "act-2".to_owned()]);
    let jobs: Vec<Value> = keys.iter().map(|key| json!({"key": key, "payload": "hi"})).collect();
    let (status, answer) = api.post("/api/pools/echo/batch", json!({"jobs": jobs})).await;
    assert_eq!(status, 200, "{answer}");
    api.until("every job runs", "/api/pools", |_, pools| pools["pools"][0]["jobs"]["running"] == 132).await;

    let mut browser = Browser::launch().await;
    browser.call("Page.navigate", json!({"url": format!("{}/#token={token}", api.base)})).await;
    let pool = r#"document.querySelector('[data-pool="echo"]')"#;
    browser
        .until(
            "the first page of jobs is shown",
            &format!("{pool}?.querySelectorAll('[data-job]').length >= 90"),
        )
        .await;

    // The charts: the host's rates saw the dispatches and starts, the
    // pool's jobs reach 132, and they go on drawing a point a second.
    // A point holds one second's count: summed, they are every dispatch.
    let sum = |series: &Value, field: &str| {
        series["points"].as_array().unwrap().iter().map(|p| p[field].as_f64().unwrap()).sum::<f64>()
    };
    api.until("the series counted the dispatches and starts", "/api/pools/echo/series", |_, series| {
        sum(series, "dispatches") >= 132.0 && sum(series, "starts") >= 132.0
    })
    .await;
    browser
        .until(
            "the jobs chart shows 132 running",
            &format!("{pool}.querySelector('[data-chart=\"jobs\"]')?.dataset.last.startsWith('132,')"),
        )
        .await;
    for chart in ["rates", "latency", "per-worker"] {
        let points =
            browser.eval(&format!("+{pool}.querySelector('[data-chart=\"{chart}\"]').dataset.points")).await;
        assert!(points.as_f64().unwrap() >= 1.0, "{chart}: {points}");
    }
    let drawn =
        browser.eval(&format!("+{pool}.querySelector('[data-chart=\"rates\"]').dataset.points")).await;
    browser
        .until(
            "the charts draw a new point",
            &format!("+{pool}.querySelector('[data-chart=\"rates\"]').dataset.points > {drawn}"),
        )
        .await;
    let starts_drawn = browser
        .eval(&format!("{pool}.querySelector('[data-chart=\"rates\"] polyline[data-series=\"starts\"]').getAttribute('points').length"))
        .await;
    assert!(starts_drawn.as_u64().unwrap() > 0, "the starts line is drawn");

    // Paging through shows every job once the last page is reached.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let page = browser
            .eval(&format!("[...{pool}.querySelectorAll('[data-job]')].map(r => r.dataset.job)"))
            .await;
        seen.extend(page.as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_owned()));
        if browser.eval(&format!("{pool}.querySelector('[data-page=\"next\"]').disabled")).await
            == Value::Bool(true)
        {
            break;
        }
        let label = browser.eval(&format!("{pool}.querySelector('.pager span').textContent")).await;
        browser.eval(&format!("{pool}.querySelector('[data-page=\"next\"]').click()")).await;
        browser
            .until(
                "the next page is shown",
                &format!("{pool}.querySelector('.pager span').textContent !== {label}"),
            )
            .await;
    }
    assert_eq!(seen, keys.iter().cloned().collect(), "paging through shows every job");

    // The prefix filter narrows the listing to the two jobs.
    browser
        .eval(&format!(
            "{pool}.querySelector('[data-filter=\"prefix\"]').value = 'act-'; {pool}.querySelector('[data-filter=\"apply\"]').click()"
        ))
        .await;
    browser
        .until(
            "only the two act- jobs are listed",
            &format!(
                "[...{pool}.querySelectorAll('[data-job]')].map(r => r.dataset.job).join() === 'act-1,act-2'"
            ),
        )
        .await;

    // A job's page: its record, its node and its history.
    browser.eval(&format!("{pool}.querySelector('[data-job=\"act-1\"]').click()")).await;
    let pid = api.host.child.id();
    browser
        .until(
            "act-1's page shows it running on this host's process, dispatched",
            &format!(
                "{pool}.querySelector('[data-job-state]')?.dataset.jobState === 'running' && {pool}.querySelector('[data-job-panel]').innerText.includes('pid {pid}') && {pool}.querySelector('[data-job-history]').innerText.includes('dispatched')"
            ),
        )
        .await;

    // Retry and forget are for failed jobs only.
    for action in ["retry", "forget"] {
        let disabled =
            browser.eval(&format!("{pool}.querySelector('[data-action=\"{action}\"]').disabled")).await;
        assert_eq!(disabled, Value::Bool(true), "{action} on a running job");
    }
    // An action asks first; cancelled, nothing is sent.
    browser.eval(&format!("{pool}.querySelector('[data-action=\"stop\"]').click()")).await;
    assert_eq!(browser.eval(&format!("{pool}.querySelector('.confirm').hidden")).await, Value::Bool(false));
    browser.eval(&format!("{pool}.querySelector('[data-confirm=\"no\"]').click()")).await;
    assert_eq!(browser.eval(&format!("{pool}.querySelector('.confirm').hidden")).await, Value::Bool(true));
    assert_eq!(api.get("/api/pools/echo/jobs/act-1").await.0, 200, "a cancelled stop sends nothing");

    // Notify, confirmed: the plugin gets it and emits it.
    browser
        .eval(&format!(
            "{pool}.querySelector('[data-action-payload]').value = 'hello from the page'; {pool}.querySelector('[data-action=\"notify\"]').click()"
        ))
        .await;
    browser.eval(&format!("{pool}.querySelector('[data-confirm=\"yes\"]').click()")).await;
    api.until(
        "the plugin emitted the page's notification",
        "/api/pools/echo/events?limit=50",
        |_, events| {
            events["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["key"] == "act-1" && e["payload"] == "hello from the page")
        },
    )
    .await;
    browser
        .until(
            "the job's page lists the event",
            &format!("{pool}.querySelector('[data-job-panel]').innerText.includes('hello from the page')"),
        )
        .await;
    browser.screenshot("status-page-job.png").await;

    // Stop, confirmed: the job is gone, the other one stays.
    browser.eval(&format!("{pool}.querySelector('[data-action=\"stop\"]').click()")).await;
    browser.eval(&format!("{pool}.querySelector('[data-confirm=\"yes\"]').click()")).await;
    api.until("act-1 is stopped", "/api/pools/echo/jobs/act-1", |status, _| status == 404).await;
    browser
        .until(
            "the page says so",
            &format!("{pool}.querySelector('[data-job-state]')?.dataset.jobState === 'gone' && {pool}.querySelector('[data-action-message]').textContent.includes('stopped')"),
        )
        .await;
    assert_eq!(api.get("/api/pools/echo/jobs/act-2").await.0, 200, "the stop left act-2 alone");
    assert_eq!(api.host.terminate(), 0);
}
