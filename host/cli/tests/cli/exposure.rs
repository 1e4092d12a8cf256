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
    let closed = |stream: &mut TcpStream| {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let gone = matches!(stream.read(&mut byte), Ok(0))
            || matches!(stream.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
        stream.set_nonblocking(false).unwrap();
        gone
    };

    // A byte of headers every 100 ms: cut off at the header timeout, not
    // held while it trickles.
    let mut slow = TcpStream::connect(&address).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").unwrap();
    let mut sent = 0;
    while !closed(&mut slow) {
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
    assert!(idle.iter_mut().any(closed), "the third connection was served while two others were open");
    assert!(started.elapsed() < PATIENCE);
    // An idle connection does not stay.
    let mut lone = TcpStream::connect(&address).unwrap();
    lone.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buffer = [0u8; 64];
    assert_eq!(lone.read(&mut buffer).unwrap_or(0), 0, "an idle connection was kept open");
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
