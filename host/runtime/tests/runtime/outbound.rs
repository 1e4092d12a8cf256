//! Outgoing HTTP of plugins (`fetcher`), against a server on loopback:
//! allowed destinations reached, others denied before anything is sent,
//! limits (a request body too large, a slow connection), the fence, and
//! state that keeps a moved job from emitting an unchanged body again.

use std::time::{Duration, Instant};

use pulse_runtime::{
    AllowedHost, CallError, Fence, Isolation, Job, Outbound, OutboundTls, Plugin, PluginOptions, Recorder,
    Runtime,
};
use pulse_testkit::HttpServer;
use pulse_testkit::plugins::FETCHER;

use crate::{PATIENCE, load, options, runner, runtime};

/// `fetcher` in job isolation, allowed to reach `server` only, with
/// `limits`; with the runtime that runs it.
fn fetcher(server: &HttpServer, limits: Outbound) -> (Runtime, Plugin) {
    let allowed = vec![server.url("").parse::<AllowedHost>().unwrap()];
    let options = PluginOptions { outbound: Outbound { allowed, ..limits }, ..options(Isolation::Job, &[]) };
    let runtime = runtime();
    let plugin = load(&runtime, FETCHER, options);
    (runtime, plugin)
}

/// A job polling `url` once an hour (so only its start and explicit
/// notifications poll).
fn job(key: &str, url: &str) -> Job {
    Job::new(key, format!("{url} 3600000"))
}

/// Fences job `key` once `server` received a request for `path`.
async fn fence_once_received(server: &HttpServer, path: &str, recorder: &Recorder, key: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while server.count(path) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the request never reached the server");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    recorder.fence(key);
}

fn texts(events: &[Vec<u8>]) -> Vec<String> {
    events.iter().map(|event| String::from_utf8_lossy(event).into_owned()).collect()
}

#[tokio::test]
async fn an_allowed_get_is_sent_and_its_body_emitted_once_until_it_changes() {
    let server = HttpServer::start();
    server.set("/status", b"all good");
    let (_runtime, plugin) = fetcher(&server, Outbound::default());
    let (runner, recorder) = runner(&plugin);
    runner.start(job("status", &server.url("/status"))).await.unwrap();
    assert_eq!(recorder.emitted("status"), vec![b"200 all good".to_vec()]);
    // Unchanged: asked with its ETag, answered 304, nothing emitted.
    runner.notify("status", Vec::new()).await.unwrap();
    let received = server.received();
    assert_eq!(received.len(), 2, "{received:?}");
    assert!(received[1].headers.iter().any(|(name, _)| name == "if-none-match"), "{received:?}");
    assert_eq!(
        received[0].headers.iter().find(|(n, _)| n == "host").map(|(_, v)| v.clone()),
        Some(server.address().to_string())
    );
    server.set("/status", b"degraded");
    runner.notify("status", Vec::new()).await.unwrap();
    assert_eq!(recorder.emitted("status"), vec![b"200 all good".to_vec(), b"200 degraded".to_vec()]);
    // A move: the job starts again elsewhere with the state it saved, and
    // does not emit the unchanged body again.
    let saved = recorder.saved_state("status").unwrap();
    runner.stop("status").await.unwrap();
    let (moved, moved_recorder) = crate::runner(&plugin);
    let again = Job { requeued: true, state: Some(saved), ..job("status", &server.url("/status")) };
    moved.start(again).await.unwrap();
    assert_eq!(server.count("/status"), 4, "the moved job polls at once");
    assert_eq!(
        moved_recorder.emitted("status"),
        Vec::<Vec<u8>>::new(),
        "the moved job emitted the same body again"
    );
}

#[tokio::test]
async fn a_post_carries_its_body_and_headers_and_its_answer_comes_back() {
    let server = HttpServer::start();
    server.set("/echo", b"");
    let (_runtime, plugin) = fetcher(&server, Outbound::default());
    let (runner, recorder) = runner(&plugin);
    runner.start(job("push", &server.url("/echo"))).await.unwrap();
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    runner.notify("push", body.clone()).await.unwrap();
    let posted =
        server.received().into_iter().find(|r| r.method == "POST").expect("a POST reached the server");
    assert!(posted.body == body, "the request's body: {} bytes of {}", posted.body.len(), body.len());
    let header = |name: &str| posted.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(header("content-type").as_deref(), Some("application/octet-stream"));
    assert_eq!(header("x-fetcher-run").map(|run| run.len()), Some(16), "{posted:?}");
    let answer = recorder.emitted("push").last().cloned().unwrap_or_default();
    assert!(answer == [b"200 ".as_slice(), &body].concat(), "the answer: {} bytes", answer.len());
}

/// Each request's value of header `name`.
fn header_of(server: &HttpServer, path: &str, name: &str) -> Vec<Option<String>> {
    server
        .received()
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
        .collect()
}

#[tokio::test]
async fn a_job_s_requests_carry_its_fence_and_the_plugin_reads_the_same_with_env_fence() {
    let server = HttpServer::start();
    server.set("/write", b"");
    let (_runtime, plugin) = fetcher(&server, Outbound::default());
    let (runner, recorder) = runner(&plugin);
    let key = "a b/ü";
    let token = 1_796_000_000_000_042;
    recorder.set_fence(Fence { pool: "accounts".into(), key: key.into(), token });
    runner.start(job(key, &server.url("/write"))).await.unwrap();
    runner.notify(key, b"debit 10".to_vec()).await.unwrap();
    // The GET of the start and the POST of the notification.
    let fence = Some(format!("accounts/a%20b%2F%C3%BC/{token}"));
    assert_eq!(header_of(&server, "/write", "pulse-fence"), [fence.clone(), fence]);
    // `X-Fetcher-Run` is what the plugin read with `env.fence`.
    assert_eq!(
        header_of(&server, "/write", "x-fetcher-run"),
        [Some(token.to_string()), Some(token.to_string())]
    );

    // A plugin whose requests carry no fence header still reads its fence.
    server.set("/quiet", b"");
    let (_runtime, plugin) = fetcher(&server, Outbound { fence_header: None, ..Outbound::default() });
    let (quiet, recorder) = crate::runner(&plugin);
    recorder.set_fence(Fence { pool: "accounts".into(), key: "quiet".into(), token: 7 });
    quiet.start(job("quiet", &server.url("/quiet"))).await.unwrap();
    assert_eq!(header_of(&server, "/quiet", "pulse-fence"), [None]);
    assert_eq!(header_of(&server, "/quiet", "x-fetcher-run"), [Some("7".to_owned())]);
}

#[tokio::test]
async fn a_host_port_or_scheme_not_listed_is_denied_before_anything_is_sent() {
    let server = HttpServer::start();
    server.set("/x", b"x");
    let other = HttpServer::start();
    other.set("/x", b"x");
    let port = server.address().port();
    let (_runtime, plugin) = fetcher(&server, Outbound::default());
    let (runner, recorder) = runner(&plugin);
    let denied = [
        ("host", format!("http://localhost:{port}/x")),
        ("port", other.url("/x")),
        ("scheme", format!("https://127.0.0.1:{port}/x")),
    ];
    for (key, url) in &denied {
        runner.start(job(key, url)).await.unwrap();
        let emitted = texts(&recorder.emitted(key));
        assert!(
            matches!(emitted.as_slice(), [event] if event.starts_with("error ") && event.contains("HttpRequestDenied")),
            "{key}: {url}: {emitted:?}"
        );
    }
    runner.start(job("listed", &server.url("/x"))).await.unwrap();
    assert_eq!(recorder.emitted("listed"), vec![b"200 x".to_vec()]);
    assert_eq!(server.received_count(), 1, "only the listed request reached the server");
    assert_eq!(other.received_count(), 0, "a request reached a port not listed");
}

#[tokio::test]
async fn a_slow_server_meets_the_timeout_and_a_big_body_the_size_limit() {
    let server = HttpServer::start();
    let limits = Outbound {
        first_byte_timeout: Duration::from_millis(300),
        max_response_bytes: 1024,
        ..Outbound::default()
    };
    let (_runtime, plugin) = fetcher(&server, limits);
    let (runner, recorder) = runner(&plugin);
    runner.start(job("slow", &server.url("/slow/3000"))).await.unwrap();
    let emitted = texts(&recorder.emitted("slow"));
    assert!(
        matches!(emitted.as_slice(), [event] if event.starts_with("error ") && event.contains("imeout")),
        "{emitted:?}"
    );
    runner.start(job("small", &server.url("/big/1024"))).await.unwrap();
    assert_eq!(recorder.emitted("small").first().map(Vec::len), Some(4 + 1024));
    runner.start(job("big", &server.url("/big/65536"))).await.unwrap();
    let emitted = texts(&recorder.emitted("big"));
    assert!(
        matches!(emitted.as_slice(), [event] if event.starts_with("error ") && event.contains("body size") && event.contains("1024")),
        "{emitted:?}"
    );
}

#[tokio::test]
async fn a_request_body_over_the_limit_is_not_sent_and_the_plugin_is_told_why() {
    let server = HttpServer::start();
    server.set("/echo", b"");
    let limits = Outbound { max_request_bytes: 1024, ..Outbound::default() };
    let (_runtime, plugin) = fetcher(&server, limits);
    let (runner, recorder) = runner(&plugin);
    runner.start(job("push", &server.url("/echo"))).await.unwrap();
    runner.notify("push", vec![b'a'; 1024]).await.unwrap();
    assert_eq!(recorder.emitted("push").last().map(Vec::len), Some(4 + 1024), "a body at the limit is sent");
    // Just over, and far over: the host stops reading the body at once,
    // so the guest's writes fail too, and the response says why.
    for size in [1025, 1 << 20] {
        runner.notify("push", vec![b'b'; size]).await.unwrap();
        let emitted = texts(&recorder.emitted("push"));
        assert!(
            matches!(emitted.last(), Some(event) if event.starts_with("error ") && event.contains("HttpRequestBodySize") && event.contains("1024")),
            "{size} bytes: {:?}",
            emitted.last()
        );
    }
    let posts: Vec<usize> =
        server.received().iter().filter(|r| r.method == "POST").map(|r| r.body.len()).collect();
    assert_eq!(posts, [1024], "the body over the limit reached the server");
}

/// How many connections the kernel dropped because a listener's accept
/// queue was full (`ListenOverflows` in /proc/net/netstat).
fn listen_overflows() -> u64 {
    let netstat = std::fs::read_to_string("/proc/net/netstat").unwrap();
    let mut lines = netstat.lines().filter(|line| line.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let at = names.split_whitespace().position(|name| name == "ListenOverflows").unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_connect_timeout_bounds_the_tcp_connection_and_the_tls_handshake_together() {
    // A listener whose accept queue is full (one connection that nobody
    // accepts): the kernel drops the fetcher's SYN, and takes it when the
    // fetcher sends it again, 1 s later, once the queue has room. Then
    // the server never answers the TLS handshake.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let _waiting = std::net::TcpStream::connect(address).unwrap();
    let dropped = listen_overflows();
    let connect_timeout = Duration::from_millis(1500);
    let allowed = vec![format!("https://{address}").parse::<AllowedHost>().unwrap()];
    let limits = Outbound { allowed, connect_timeout, ..Outbound::default() };
    let options = PluginOptions { outbound: limits, ..options(Isolation::Job, &[]) };
    let runtime = runtime();
    let plugin = load(&runtime, FETCHER, options);
    let (runner, recorder) = runner(&plugin);
    let began = Instant::now();
    let ((started, took), (connected, _silent)) = tokio::join!(
        async { (runner.start(job("slow", &format!("https://{address}/"))).await, began.elapsed()) },
        async {
            while listen_overflows() == dropped {
                assert!(began.elapsed() < PATIENCE, "the kernel never dropped the fetcher's SYN");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let _room = listener.accept().await.unwrap();
            let silent = listener.accept().await.unwrap();
            (began.elapsed(), silent)
        }
    );
    started.unwrap();
    assert!(connected > Duration::from_millis(800), "TCP took most of the timeout: {connected:?}");
    let emitted = texts(&recorder.emitted("slow"));
    assert!(
        matches!(emitted.as_slice(), [event] if event.starts_with("error ") && event.contains("ConnectionTimeout")),
        "{emitted:?}"
    );
    // TCP and TLS share the 1.5 s: the handshake gets what TCP left, not
    // 1.5 s of its own.
    assert!(took < connect_timeout + Duration::from_millis(500), "the connection took {took:?}");
}

#[tokio::test]
async fn a_fenced_job_sends_nothing_and_its_request_in_flight_is_cancelled() {
    let server = HttpServer::start();
    server.set("/x", b"x");
    let (_runtime, plugin) = fetcher(&server, Outbound::default());
    let (runner, recorder) = runner(&plugin);
    runner.start(job("fenced", &server.url("/x"))).await.unwrap();
    assert_eq!(server.count("/x"), 1);
    recorder.fence("fenced");
    let _ = runner.notify("fenced", Vec::new()).await;
    assert_eq!(server.count("/x"), 1, "a fenced job sent a request");
    // In flight when the fence falls: cancelled. The call returns with
    // the fetcher's own error (its emit is refused too), not the call
    // timeout (10 s), long before the server would answer (60 s).
    let url = server.url("/slow/60000");
    let (started, ()) = tokio::join!(
        runner.start(job("in-flight", &url)),
        fence_once_received(&server, "/slow/60000", &recorder, "in-flight")
    );
    assert!(
        !matches!(started, Err(CallError::Timeout(_))),
        "the request went on after the fence fell: {started:?}"
    );
}

#[tokio::test]
async fn a_response_still_arriving_when_the_fence_falls_is_cut_off() {
    let server = HttpServer::start();
    // Without the fence, reading the body would wait for it (60 s) past
    // the call's timeout (10 s).
    let limits = Outbound { first_byte_timeout: Duration::from_secs(60), ..Outbound::default() };
    let (_runtime, plugin) = fetcher(&server, limits);
    let (runner, recorder) = runner(&plugin);
    let url = server.url("/drip/60000");
    let (started, ()) = tokio::join!(
        runner.start(job("dripping", &url)),
        fence_once_received(&server, "/drip/60000", &recorder, "dripping")
    );
    assert!(
        !matches!(started, Err(CallError::Timeout(_))),
        "the response's body was still read after the fence fell: {started:?}"
    );
    let emitted = texts(&recorder.emitted("dripping"));
    assert!(
        matches!(emitted.as_slice(), [event] if event.starts_with("error ") && event.to_lowercase().contains("denied")),
        "the fetcher read more than the head: {emitted:?}"
    );
}

#[tokio::test]
async fn https_reaches_a_server_signed_by_the_ca_file_and_not_one_the_webpki_roots_do_not_know() {
    let server = HttpServer::start_tls();
    server.set("/status", b"secure");
    let ca_file = server.ca_file().expect("an HTTPS server");
    let tls = OutboundTls::with_ca_file(ca_file).unwrap();
    let (_runtime, plugin) = fetcher(&server, Outbound { tls, ..Outbound::default() });
    let (runner, recorder) = runner(&plugin);
    runner.start(job("trusted", &server.url("/status"))).await.unwrap();
    assert_eq!(texts(&recorder.emitted("trusted")), vec!["200 secure".to_owned()]);
    assert_eq!(server.count("/status"), 1);

    // The webpki roots alone: the handshake fails, nothing is sent.
    let (_runtime, plugin) = fetcher(&server, Outbound::default());
    let (untrusted, recorder) = crate::runner(&plugin);
    untrusted.start(job("untrusted", &server.url("/status"))).await.unwrap();
    let emitted = texts(&recorder.emitted("untrusted"));
    assert!(
        matches!(emitted.as_slice(), [event] if event.starts_with("error ") && event.contains("TlsCertificateError")),
        "{emitted:?}"
    );
    assert_eq!(server.count("/status"), 1, "a request went through a handshake with an untrusted server");
}

#[test]
fn a_ca_file_without_certificates_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let error = OutboundTls::with_ca_file(&empty).unwrap_err().to_string();
    assert!(error.contains("empty.pem") && error.contains("no certificate"), "{error}");
    let missing = dir.path().join("missing.pem");
    let error = OutboundTls::with_ca_file(&missing).unwrap_err().to_string();
    assert!(error.contains("missing.pem") && error.contains("expected PEM certificates"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_offers_http2_gets_the_requests_of_many_jobs_at_once_over_one_connection() {
    // The server speaks HTTP/2 only: a request sent any other way fails.
    let server = HttpServer::start_h2();
    server.set("/status", b"multiplexed");
    let tls = OutboundTls::with_ca_file(server.ca_file().expect("an HTTPS server")).unwrap();
    let (_runtime, plugin) = fetcher(&server, Outbound { tls, ..Outbound::default() });
    let (runner, recorder) = runner(&plugin);
    recorder.set_fence(Fence { pool: "accounts".into(), key: "first".into(), token: 7 });
    runner.start(job("first", &server.url("/status"))).await.unwrap();
    assert_eq!(texts(&recorder.emitted("first")), vec!["200 multiplexed".to_owned()]);
    // Fenced as over HTTP/1.1: the header travels with the request.
    assert_eq!(header_of(&server, "/status", "pulse-fence"), [Some("accounts/first/7".to_owned())]);

    // 20 jobs whose requests the server holds 300 ms each, started at once:
    // their requests travel together over the connection the first opened.
    let runner = std::sync::Arc::new(runner);
    let mut starts = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (runner, url) = (runner.clone(), server.url("/slow/300"));
        starts.spawn(async move { runner.start(job(&format!("slow-{i}"), &url)).await });
    }
    while let Some(started) = starts.join_next().await {
        started.unwrap().unwrap();
    }
    for i in 0..20 {
        assert_eq!(texts(&recorder.emitted(&format!("slow-{i}"))), vec!["200 slow".to_owned()]);
    }
    assert_eq!(server.count("/slow/300"), 20);
    assert!(server.most_at_once() > 1, "the requests never overlapped: {} at once", server.most_at_once());
    assert_eq!(server.connections(), 1, "{} connections for 21 requests", server.connections());
}
