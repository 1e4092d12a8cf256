//! What a host exposes, and to whom: HTTP clients that are slow, idle,
//! too many, from a foreign page or behind a rebound name; the HTTP token
//! from a file or the environment; Redis over TLS as an ACL user; and no
//! secret in any output.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pulse_testkit::RedisServer;
use pulse_testkit::plugins::ECHO;
use serde_json::Value;

use crate::http::Served;
use crate::{Host, PATIENCE, binary, cli, cli_all, wait_for_workers, write_config};

/// Sends `request` on a new connection and reads the answer until the
/// server closes it: status, headers and JSON body.
fn raw(base: &str, request: &str) -> (u16, String, Value) {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_owned(), serde_json::from_str(body).unwrap_or(Value::Null))
}

fn request(method: &str, path: &str, host: &str, headers: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn browsers_cannot_be_turned_against_the_api_and_every_error_is_json() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[("echo", ECHO, "")], "[http]\nlisten = \"127.0.0.1:0\"\n");
    let api = Served::start(&config, server.url(), None).await;
    let own = api.base.trim_start_matches("http://").to_owned();
    let json = "Content-Type: application/json\r\n";

    // DNS rebinding: a name that is not this API's.
    let (status, _, body) = raw(&api.base, &request("GET", "/api/pools", "rebind.attacker.example", "", ""));
    assert_eq!((status, body["error"].as_str()), (421, Some("unknown_host")), "{body}");
    let port = own.rsplit(':').next().unwrap();
    let (status, _, _) = raw(&api.base, &request("GET", "/api/pools", &format!("localhost:{port}"), "", ""));
    assert_eq!(status, 200);

    // A foreign page: a simple POST (no preflight) and a form.
    let text = "Content-Type: text/plain\r\nOrigin: http://attacker.example\r\n";
    let (status, _, body) =
        raw(&api.base, &request("POST", "/api/pools/echo/jobs/k/retry", &own, text, "{}"));
    assert_eq!((status, body["error"].as_str()), (403, Some("foreign_origin")), "{body}");
    let form = "Content-Type: application/x-www-form-urlencoded\r\n";
    let (status, _, body) =
        raw(&api.base, &request("POST", "/api/pools/echo/jobs/k/forget", &own, form, "a=b"));
    assert_eq!((status, body["error"].as_str()), (415, Some("not_json")), "{body}");
    let foreign = format!("{json}Origin: http://attacker.example\r\n");
    let (status, _, body) = raw(&api.base, &request("DELETE", "/api/pools/echo/jobs/k", &own, &foreign, ""));
    assert_eq!((status, body["error"].as_str()), (403, Some("foreign_origin")), "{body}");
    // The API's own page may.
    let same = format!("{json}Origin: http://{own}\r\n");
    let (status, _, body) =
        raw(&api.base, &request("POST", "/api/pools/echo/jobs", &own, &same, r#"{"key": "mine"}"#));
    assert_eq!((status, body["outcome"].as_str()), (201, Some("started")), "{body}");

    // 405 in the API's shape, with Allow.
    let (status, head, body) = raw(&api.base, &request("PUT", "/api/pools", &own, json, "{}"));
    assert_eq!((status, body["error"].as_str()), (405, Some("method_not_allowed")), "{body}");
    assert!(head.to_ascii_lowercase().contains("allow: get"), "{head}");
    assert!(body["message"].as_str().unwrap().contains("GET"), "{body}");
}

#[tokio::test]
async fn slow_idle_and_surplus_http_clients_cannot_hold_the_host() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let http = "[http]\nlisten = \"127.0.0.1:0\"\nheader_timeout = \"500ms\"\nidle_timeout = \"1s\"\nmax_connections = 2\n";
    let config = write_config(dir.path(), &[("echo", ECHO, "")], http);
    let api = Served::start(&config, server.url(), None).await;
    let address = api.base.trim_start_matches("http://").to_owned();

    // A byte of headers every 100 ms: cut off at the header timeout, not
    // held while it trickles.
    let mut slow = TcpStream::connect(&address).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").unwrap();
    let mut sent = 0;
    while !drained_and_closed(&mut slow) {
        assert!(sent < 100, "a client trickling headers was held {sent} x 100 ms");
        let _ = slow.write_all(b"a");
        std::thread::sleep(Duration::from_millis(100));
        sent += 1;
    }

    // Idle connections are closed; while two are open (the limit), a third
    // is served only once one of them is.
    let mut idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&address).unwrap()).collect();
    // Both accepted (each answers a request before going idle).
    for stream in &mut idle {
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut buffer = [0u8; 512];
        assert!(stream.read(&mut buffer).unwrap() > 0);
    }
    let started = Instant::now();
    let (status, _, _) = raw(&api.base, &request("GET", "/healthz", &address, "", ""));
    assert_eq!(status, 200);
    assert!(
        idle.iter_mut().any(drained_and_closed),
        "the third connection was served while two others were open"
    );
    assert!(started.elapsed() < PATIENCE);
    // An idle connection does not stay.
    let mut lone = TcpStream::connect(&address).unwrap();
    lone.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buffer = [0u8; 64];
    assert_eq!(lone.read(&mut buffer).unwrap_or(0), 0, "an idle connection was kept open");
}

/// The sending side of an HTTP/2 client connection.
pub(crate) type Http2 = hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// An HTTP/2 connection on `stream` (prior knowledge), its client pinging
/// every 100 ms; the connection's task ends when the server closes it.
pub(crate) async fn http2(
    stream: impl hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
) -> (Http2, tokio::task::JoinHandle<()>) {
    let (send, connection) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(100))
        .keep_alive_while_idle(true)
        .handshake(stream)
        .await
        .unwrap();
    (send, tokio::spawn(async move { connection.await.unwrap_or_default() }))
}

/// `method` `path` on an HTTP/2 connection (with a JSON body when one is
/// given): the status and the body as JSON.
pub(crate) async fn http2_send(
    send: &mut Http2,
    method: &str,
    uri: &str,
    body: Option<&str>,
) -> (u16, Value) {
    use http_body_util::BodyExt as _;
    let mut request = hyper::Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request =
        request.body(http_body_util::Full::new(bytes::Bytes::from(body.unwrap_or("").to_owned()))).unwrap();
    send.ready().await.unwrap();
    let response = send.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_share_a_connection_and_slow_or_idle_ones_are_closed() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let http = "[http]\nlisten = \"127.0.0.1:0\"\nheader_timeout = \"1s\"\nidle_timeout = \"2s\"\n";
    let config = write_config(dir.path(), &[("echo", ECHO, "[plugin.settings]\nprefix = \"h2:\"")], http);
    let api = Served::start(&config, server.url(), None).await;
    wait_for_workers(&config, Some(server.url()), "echo", 1);
    let address = api.base.trim_start_matches("http://").to_owned();

    // Eight dispatches at once, streams of one connection: each started
    // (a worker's `start` ran and answered), and each job's event is the
    // echo of its own payload.
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (send, connection) = http2(hyper_util::rt::TokioIo::new(tcp)).await;
    let base = format!("http://{address}/api/pools/echo");
    let answers = futures_util::future::join_all((0..8).map(|i| {
        let (mut send, uri) = (send.clone(), format!("{base}/jobs"));
        async move {
            let body = format!(r#"{{"key": "h2-{i}", "payload": "p{i}"}}"#);
            http2_send(&mut send, "POST", &uri, Some(&body)).await
        }
    }))
    .await;
    for (status, body) in &answers {
        assert_eq!((*status, body["outcome"].as_str()), (201, Some("started")), "{body}");
    }
    let (status, events) =
        http2_send(&mut send.clone(), "GET", &format!("{base}/events?limit=100"), None).await;
    assert_eq!(status, 200, "{events}");
    let mut echoed: Vec<(String, String)> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (e["key"].as_str().unwrap().to_owned(), e["payload"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    echoed.sort();
    let expected: Vec<(String, String)> = (0..8).map(|i| (format!("h2-{i}"), format!("h2:p{i}"))).collect();
    assert_eq!(echoed, expected, "{events}");

    // HTTP/2 names the host in `:authority`, which is checked as `Host` is.
    let port = address.rsplit_once(':').unwrap().1;
    let (status, body) =
        http2_send(&mut send.clone(), "GET", &format!("http://rebound.example:{port}/api/pools"), None).await;
    assert_eq!((status, body["error"].as_str()), (421, Some("unknown_host")), "{body}");

    // Idle, it is closed after `idle_timeout`, though its client pings.
    tokio::time::timeout(PATIENCE, connection).await.expect("an idle HTTP/2 connection was kept").unwrap();
    drop(send);

    // A client that opens HTTP/2 and then trickles a request's headers (a
    // frame of 256 bytes, a byte every 100 ms: whole after 26 s), or only
    // pings, is cut off at the header timeout.
    const HEADERS: [u8; 9] = [0x00, 0x01, 0x00, 0x01, 0x05, 0x00, 0x00, 0x00, 0x01];
    for pings in [false, true] {
        let mut stream = TcpStream::connect(&address).unwrap();
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").unwrap();
        let mut sent = 0;
        while !drained_and_closed(&mut stream) {
            assert!(
                sent < 100,
                "a client {} was held {sent} x 100 ms",
                if pings { "pinging" } else { "trickling headers" }
            );
            let _ = match pings {
                true => stream.write_all(&PING),
                false => stream.write_all(&[HEADERS.get(sent).copied().unwrap_or(0)]),
            };
            std::thread::sleep(Duration::from_millis(100));
            sent += 1;
        }
    }
}

/// An HTTP/2 PING frame.
const PING: [u8; 17] = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];

/// Reads what the server sent so far; whether it has closed the
/// connection (an end of stream, or a reset).
fn drained_and_closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buffer = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut buffer) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) => break e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

#[tokio::test]
async fn the_token_comes_from_a_file_or_the_environment_and_is_never_printed() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = "file-token-0123456789abcdef";
    std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
    let config = write_config(
        dir.path(),
        &[("echo", ECHO, "")],
        "[http]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"token\"\n",
    );
    let api = Served::start(&config, server.url(), Some(token)).await;
    assert_eq!(api.get("/api/pools").await.0, 200);
    assert_eq!(api.send("GET", "/api/pools", None, None).await.0, 401);
    let log = std::fs::read_to_string(config.with_file_name("host.log")).unwrap();
    assert!(!log.contains(token), "{log}");
    drop(api);

    // From the environment: checked like the file's.
    let output = Command::new(binary())
        .arg("--config")
        .arg(&config)
        .args(["--redis", server.url(), "run"])
        .env("PULSE_HTTP_TOKEN", "short")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("PULSE_HTTP_TOKEN must be 16 to 4,096 printable"), "{stderr}");

    // Redis passwords: not in --help (the environment's value), not in
    // errors.
    let secret = "redis-secret-pw-42";
    let output = Command::new(binary())
        .arg("--help")
        .env("PULSE_REDIS_URL", format!("redis://:{secret}@127.0.0.1:1/"))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&output.stdout).contains(secret));
    let bad = format!("redis://app:{secret}@127.0.0.1:notaport/");
    let (code, _, stderr) = cli_all(&config, &bad, &["jobs", "--pool", "echo"]);
    assert_ne!(code, 0);
    assert!(!stderr.contains(secret) && stderr.contains("redis://app:***@127.0.0.1:notaport/"), "{stderr}");
}

/// A CA and a certificate for 127.0.0.1 and localhost signed by it, made
/// with `openssl` in `dir`.
fn certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl").args(args).current_dir(dir).output().unwrap();
        assert!(status.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&status.stderr));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=pulse-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "ext",
    ]);
}

/// A `redis-server` that speaks TLS only, with the ACL user `app`.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
}

impl TlsRedis {
    fn start(dir: &Path, password: &str) -> Self {
        let port = pulse_testkit::free_address().unwrap().port();
        let child = Command::new("redis-server")
            .current_dir(dir)
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
                "--tls-ca-cert-file",
                "ca.crt",
            ])
            .args(["--tls-auth-clients", "no", "--save", "", "--appendonly", "no"])
            .args([
                "--user",
                "default",
                "off",
                "--user",
                "app",
                "on",
                &format!(">{password}"),
                "~*",
                "&*",
                "+@all",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_host_reaches_redis_over_tls_as_an_acl_user_without_printing_the_password() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let password = "acl-password-7f3e9a";
    let redis = TlsRedis::start(dir.path(), password);
    let url = format!("rediss://app:{password}@127.0.0.1:{}/", redis.port);
    let config = write_config(
        dir.path(),
        &[("echo", ECHO, "")],
        &format!("[redis]\nurl = \"{url}\"\ntls_ca_file = \"ca.crt\"\n"),
    );
    let log = dir.path().join("host.log");
    let host = Host::start_logging(&config, None, &log);
    wait_for_workers(&config, None, "echo", 1);
    assert_eq!(cli(&config, None, &["dispatch", "--pool", "echo", "over-tls"]), (0, "started".into()));

    // A wrong password: refused, and not printed.
    let wrong = format!("rediss://app:wrong-{password}@127.0.0.1:{}/", redis.port);
    let (code, _, stderr) = cli_all(&config, &wrong, &["jobs", "--pool", "echo"]);
    assert_ne!(code, 0, "{stderr}");
    assert!(!stderr.contains(password), "{stderr}");
    assert_eq!(host.terminate(), 0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(password), "{text}");
}

#[test]
fn a_rediss_url_naming_a_server_without_tls_says_the_handshake_failed() {
    let plain = pulse_testkit::RedisServer::start_tcp_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[("echo", ECHO, "")], "");
    let url = format!("rediss://127.0.0.1:{}/", plain.port());
    let (code, stdout, stderr) = cli_all(&config, &url, &["jobs", "--pool", "echo"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("the TLS handshake with Redis at"), "{stderr}");
    assert!(
        stderr.contains("does the server speak TLS? (a plain server is named with redis://)"),
        "{stderr}"
    );
}
