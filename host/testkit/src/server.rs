//! Private `redis-server` processes for tests.
//!
//! Each [`RedisServer`] is a `redis-server` child process with no
//! persistence, listening on a unix socket (or a free loopback port) in its
//! own temporary folder. A test that injects faults owns one and kills,
//! pauses or restarts it; other tests share one server per test binary
//! ([`shared_redis_url`]) and keep apart by [`crate::unique`] names.
//!
//! A watchdog shell beside each server kills it when the test process dies
//! without running destructors (a panic with `panic = "abort"`, a SIGKILL,
//! the shared server at process exit): it blocks reading a pipe whose only
//! writer is the test process, and the kernel closes that pipe however the
//! process ends.

use std::fmt;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

/// How long a server may take to answer `PING` after it is spawned. Redis
/// with no persistence is ready in milliseconds; the margin is for a loaded
/// CI machine.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How many times a process on TCP is started on new ports when a port it
/// was given was taken between choosing it and binding it.
const PORT_ATTEMPTS: u32 = 5;

/// Runs `start` (which chooses new ports each time) until it succeeds, at
/// most [`PORT_ATTEMPTS`] times: a port free a moment ago may be taken
/// before the process binds it (another test's server, an ephemeral
/// port). Panics with the failure that is not a taken port, or the last.
pub(crate) fn until_a_port_holds<T>(mut start: impl FnMut() -> Result<T, String>) -> T {
    let mut attempt = 1;
    loop {
        match start() {
            Ok(started) => return started,
            Err(failure)
                if attempt < PORT_ATTEMPTS
                    && failure.to_ascii_lowercase().contains("address already in use") =>
            {
                attempt += 1;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
}

/// Where a server listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket in the server's folder: no port to collide on, and the
    /// same address after a restart.
    Unix,
    /// A free port on 127.0.0.1, chosen at start and kept across restarts.
    Tcp,
}

/// A private `redis-server` process, killed when dropped.
pub struct RedisServer {
    dir: tempfile::TempDir,
    listen: Listen,
    persistent: bool,
    port: u16,
    /// A cluster node's bus port.
    bus_port: Option<u16>,
    url: String,
    /// Arguments after the usual ones (cluster mode, replication).
    extra: Vec<String>,
    /// A sentinel's configuration file, in its folder: the server runs as
    /// a Sentinel.
    sentinel: bool,
    process: Option<Process>,
}

/// A running server and its watchdog.
struct Process {
    redis: Child,
    watchdog: Child,
    /// The watchdog's stdin; the watchdog kills the server when it closes.
    _lifeline: ChildStdin,
}

impl RedisServer {
    /// Starts a server on a unix socket.
    ///
    /// # Panics
    /// When `redis-server` is not installed (the message says how to install
    /// it) or the server does not become ready (the message holds its log).
    pub fn start() -> Self {
        Self::start_on(Listen::Unix)
    }

    /// Starts a server that listens as `listen` says.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_on(listen: Listen) -> Self {
        Self::start_with(listen, false)
    }

    /// Starts a server on a unix socket that writes every change to an
    /// append-only file (`appendfsync always`) in its folder, so a
    /// [`RedisServer::restart`] after [`RedisServer::kill`] comes back with
    /// everything it had acknowledged.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_persistent() -> Self {
        Self::start_with(Listen::Unix, true)
    }

    /// Starts a server on a free loopback port with `extra` arguments
    /// after the usual ones (`--cluster-enabled yes`, `--replicaof …`).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_tcp_with(extra: &[&str]) -> Self {
        Self::build(Listen::Tcp, false, extra.iter().map(|a| (*a).to_owned()).collect(), None, free_port)
    }

    /// Starts a Sentinel on a free loopback port whose configuration file
    /// holds `config` (its `port` line is added).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_sentinel(config: &str) -> Self {
        Self::build(Listen::Tcp, false, Vec::new(), Some(config), free_port)
    }

    /// The port of a server started on TCP.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn start_with(listen: Listen, persistent: bool) -> Self {
        Self::build(listen, persistent, Vec::new(), None, free_port)
    }

    /// A server as the `start` functions say, on TCP ports that `ports`
    /// chooses.
    fn build(
        listen: Listen,
        persistent: bool,
        extra: Vec<String>,
        sentinel: Option<&str>,
        mut ports: impl FnMut() -> u16,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("pulse-redis-")
            .tempdir()
            .expect("failed to create a folder for redis-server");
        // A cluster node's bus listens on port + 10000 unless told: that
        // port may be taken (an ephemeral port of any connection), so the
        // bus gets a free port of its own, kept across restarts.
        let cluster = extra.iter().any(|arg| arg == "--cluster-enabled");
        let mut server = Self {
            dir,
            listen,
            persistent,
            port: 0,
            bus_port: None,
            url: String::new(),
            extra,
            sentinel: sentinel.is_some(),
            process: None,
        };
        until_a_port_holds(|| {
            server.choose_address(cluster, sentinel, &mut ports);
            server.try_spawn()
        });
        server
    }

    /// Chooses the server's ports (free ones, for TCP) and its URL.
    fn choose_address(&mut self, cluster: bool, sentinel: Option<&str>, ports: &mut impl FnMut() -> u16) {
        self.port = match self.listen {
            Listen::Unix => 0,
            Listen::Tcp => ports(),
        };
        self.bus_port = cluster.then(ports);
        self.url = match self.listen {
            Listen::Unix => format!("redis+unix://{}", self.dir.path().join("redis.sock").display()),
            Listen::Tcp => format!("redis://127.0.0.1:{}/", self.port),
        };
        if let Some(config) = sentinel {
            std::fs::write(self.dir.path().join("sentinel.conf"), format!("port {}\n{config}\n", self.port))
                .expect("failed to write the sentinel's configuration");
        }
    }

    /// The URL clients connect with (`redis+unix:///…` or `redis://127.0.0.1:…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new multiplexed connection to this server.
    ///
    /// # Cancel safety
    /// Cancel safe: it only connects.
    pub async fn connect(&self) -> MultiplexedConnection {
        connect(&self.url).await
    }

    /// The operating system's id of the server process, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.redis.id())
    }

    /// Kills the server with SIGKILL, as a crash would, and waits until it
    /// is gone. Its data is lost, unless it is persistent.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            // The watchdog goes first, so it never signals a pid the system
            // may already have reused.
            let _ = process.watchdog.kill();
            let _ = process.watchdog.wait();
            let _ = process.redis.kill();
            let _ = process.redis.wait();
        }
    }

    /// Starts the server again on the same address, killing it first if it
    /// runs: empty, or for a [`RedisServer::start_persistent`] server with
    /// what its append-only file holds.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn restart(&mut self) {
        self.kill();
        if let Err(failure) = self.try_spawn() {
            panic!("{failure}");
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is
    /// answered, as with a network partition or a long pause.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes a server frozen by [`RedisServer::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// The server's log so far, for failure reports.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the server is not running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("failed to run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Spawns the server and waits until it is ready; or says why not,
    /// with what it logged.
    fn try_spawn(&mut self) -> Result<(), String> {
        let logged = std::fs::metadata(self.log_path()).map_or(0, |log| log.len());
        let dir = self.dir.path();
        let mut cmd = Command::new("redis-server");
        if self.sentinel {
            cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
        }
        let appendonly = if self.persistent { "yes" } else { "no" };
        cmd.args(["--save", "", "--appendonly", appendonly, "--appendfsync", "always", "--daemonize", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--port", &self.port.to_string()]);
        match self.listen {
            Listen::Unix => {
                cmd.arg("--unixsocket").arg(dir.join("redis.sock")).args(["--unixsocketperm", "700"]);
            }
            Listen::Tcp => {
                cmd.args(["--bind", "127.0.0.1"]);
            }
        }
        if let Some(bus_port) = self.bus_port {
            cmd.args(["--cluster-port", &bus_port.to_string()]);
        }
        cmd.args(&self.extra);
        let redis = match cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
            Ok(child) => child,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server is not installed: the tests need it on PATH \
                 (install it with `apt-get install redis-server`)"
            ),
            Err(err) => panic!("failed to start redis-server: {err}"),
        };
        let (watchdog, lifeline) = spawn_watchdog(redis.id(), dir);
        self.process = Some(Process { redis, watchdog, _lifeline: lifeline });
        let ready = self.wait_ready();
        if ready.is_err() {
            self.kill();
        }
        ready.map_err(|failure| {
            let log = self.log();
            let new = log.get(usize::try_from(logged).unwrap_or(0)..).unwrap_or(&log);
            format!("{failure}; its log:\n{new}")
        })
    }

    /// Waits until the server answers `PING`; or says why it will not.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.answers() {
                return Ok(());
            }
            let process = self.process.as_mut().expect("spawned just before");
            if let Ok(Some(status)) = process.redis.try_wait() {
                return Err(format!("redis-server exited with {status} before it was ready"));
            }
            if Instant::now() > deadline {
                return Err(format!("redis-server was not ready within {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether this server is ready: `PING` (refused while it loads its
    /// data) and `INFO server` over a fresh connection, in plain RESP,
    /// answered with `PONG` and this server's process id. Another server may
    /// have taken the port this one was given (it then exits): its answer
    /// does not count, nor does a listener that never answers.
    fn answers(&self) -> bool {
        fn exchange(mut stream: impl Read + Write, pid: u32) -> bool {
            let mut reply = Vec::new();
            let mut chunk = [0u8; 4096];
            if stream.write_all(b"PING\r\nINFO server\r\n").is_err() {
                return false;
            }
            // The section ends with an empty line; a reply is a few KiB.
            while !reply.ends_with(b"\r\n\r\n") && reply.len() < 1 << 16 {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return false,
                    Ok(read) => reply.extend_from_slice(&chunk[..read]),
                }
            }
            reply.starts_with(b"+PONG\r\n")
                && String::from_utf8_lossy(&reply).contains(&format!("\r\nprocess_id:{pid}\r\n"))
        }
        let Some(pid) = self.pid() else { return false };
        // Short: a server that is slow to answer is asked again.
        let timeout = Some(Duration::from_millis(250));
        match self.listen {
            Listen::Unix => UnixStream::connect(self.dir.path().join("redis.sock"))
                .is_ok_and(|stream| stream.set_read_timeout(timeout).is_ok() && exchange(stream, pid)),
            Listen::Tcp => std::net::TcpStream::connect(("127.0.0.1", self.port))
                .is_ok_and(|stream| stream.set_read_timeout(timeout).is_ok() && exchange(stream, pid)),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("url", &self.url)
            .field("pid", &self.pid())
            .finish_non_exhaustive()
    }
}

/// Starts a shell that kills `pid` and removes `dir` once its stdin closes.
fn spawn_watchdog(pid: u32, dir: &Path) -> (Child, ChildStdin) {
    let mut watchdog = Command::new("sh")
        .arg("-c")
        .arg(r#"read -r _; kill -9 "$0" 2>/dev/null; rm -rf "$1""#)
        .arg(pid.to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("failed to start the redis-server watchdog (sh)");
    let lifeline = watchdog.stdin.take().expect("stdin was piped");
    (watchdog, lifeline)
}

/// A port on 127.0.0.1 that was free a moment ago ([`free_address`]).
pub(crate) fn free_port() -> u16 {
    free_address().expect("failed to find a free port").port()
}

/// A loopback address nobody listens on now, for a server started in
/// another process (a host, `redis-server`) to listen on.
///
/// The port lies below the kernel's range for outgoing connections: a port
/// from that range (what binding port 0 gives) may become the local end of
/// some connection to Redis or a server before the server binds it, and
/// it would then fail with "address already in use".
pub fn free_address() -> std::io::Result<std::net::SocketAddr> {
    let (low, high) = ports_for_listeners();
    let span = u32::from(high - low);
    // Each port tried is the next of one count, so a process never tries
    // a port twice (until it has tried them all): an address given is not
    // given again while its server may not have bound it yet, even if a
    // port before it was busy. The count starts at a point that differs
    // between runs, so concurrent runs do not try the same ports in the
    // same order.
    static NEXT: OnceLock<std::sync::atomic::AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        std::sync::atomic::AtomicU32::new(
            now.map_or(0, |elapsed| elapsed.subsec_nanos()) ^ std::process::id(),
        )
    });
    for _ in 0..span {
        let port = low + (next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr();
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no free loopback port in {low}..{high}")))
}

/// Ports below the kernel's ephemeral range (`ip_local_port_range`, 32768
/// when it cannot be read) and above the well-known ones.
fn ports_for_listeners() -> (u16, u16) {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = ephemeral.max(2048);
    (high.saturating_sub(8192).max(1024), high)
}

/// The Redis the tests of this binary share: the server `REDIS_URL` names
/// when it is set, otherwise a private server started on first use and
/// killed when the test binary exits. Tests on it keep apart by
/// [`crate::unique`] names and end with [`crate::assert_no_keys`].
pub fn shared_redis_url() -> &'static str {
    static SHARED: OnceLock<(String, Option<RedisServer>)> = OnceLock::new();
    let (url, _server) = SHARED.get_or_init(|| match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let server = RedisServer::start();
            (server.url().to_owned(), Some(server))
        }
    });
    url
}

/// A new multiplexed connection to `url`.
///
/// # Panics
/// When the URL is invalid or the server does not answer.
///
/// # Cancel safety
/// Cancel safe: it only connects.
pub async fn connect(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).unwrap_or_else(|err| panic!("invalid Redis URL {url:?}: {err}"));
    client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|err| panic!("failed to connect to Redis at {url:?}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_address_is_outside_the_range_outgoing_connections_take_ports_from() {
        let (_, ephemeral) = ports_for_listeners();
        let address = free_address().unwrap();
        assert!(address.port() < ephemeral, "{address} is below {ephemeral}");
        // Not bound by its caller yet, and still not given twice. (Binding
        // it again here would test the machine: any process may take a
        // port of this range between the two binds.)
        assert_ne!(free_address().unwrap(), address);
    }

    #[test]
    fn a_server_whose_port_was_taken_starts_on_another() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let taken_port = taken.local_addr().expect("a bound listener has an address").port();
        let mut offered = vec![taken_port];
        let mut ports = || offered.pop().unwrap_or_else(free_port);
        let server = RedisServer::build(Listen::Tcp, false, Vec::new(), None, &mut ports);
        assert_ne!(server.port(), taken_port);
        assert!(server.answers(), "the server answers on port {}", server.port());
        assert!(offered.is_empty(), "the taken port was tried first");
    }
}
