//! The embedded default: with no Redis URL, `run` uses a private
//! `redis-server` in the data directory (unix socket, append-only file), and
//! client commands with the same config find it there.
//!
//! Durability: the append-only file is synced every second
//! (`appendfsync everysec`), so a host machine crash loses at most the last
//! second of changes; a killed `pulse-host` loses nothing, since the server
//! keeps running and the next `run` adopts it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};

/// How long a new server may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The socket of the private server of `data_dir`.
pub fn socket(data_dir: &Path) -> PathBuf {
    data_dir.join("redis.sock")
}

/// The URL of the private server of `data_dir`.
pub fn url(data_dir: &Path) -> String {
    format!("redis+unix://{}", socket(data_dir).display())
}

/// A private server this host started or adopted; stopped (with a final
/// write of its append-only file) by [`Embedded::stop`].
pub struct Embedded {
    url: String,
}

impl Embedded {
    /// Adopts the server already answering in `data_dir` (left by a host
    /// that was killed), or starts one.
    ///
    /// # Cancel safety
    /// Not cancel safe: a server started but not returned keeps running until
    /// the process exits.
    pub async fn start(data_dir: &Path) -> anyhow::Result<Self> {
        let url = url(data_dir);
        if answers(&url).await {
            tracing::info!(socket = %socket(data_dir).display(), "adopted the private redis-server already running");
            return Ok(Self { url });
        }
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("failed to create the data directory {}", data_dir.display()))?;
        let spawned = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--unixsocketperm",
                "700",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .args(["--save", "", "--daemonize", "no"])
            .arg("--unixsocket")
            .arg(socket(data_dir))
            .arg("--dir")
            .arg(data_dir)
            .arg("--logfile")
            .arg(data_dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // The server outlives a killed host on purpose: the next run
            // adopts it, and nothing acknowledged is lost.
            .kill_on_drop(false)
            .spawn();
        match spawned {
            Ok(_child) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
                "redis-server is not installed: with no Redis URL configured, pulse-host runs a private \
                 redis-server (install it with `apt-get install redis-server`), or give one with \
                 --redis, PULSE_REDIS_URL or redis.url in the config"
            ),
            Err(error) => return Err(error).context("failed to start redis-server"),
        }
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while !answers(&url).await {
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "the private redis-server did not answer within {READY_TIMEOUT:?}; see {}",
                    data_dir.join("redis.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::info!(socket = %socket(data_dir).display(), "started a private redis-server (append-only file in the data directory)");
        Ok(Self { url })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops the server, writing its append-only file first.
    ///
    /// # Cancel safety
    /// Not cancel safe: call it to completion, or the server may outlive the
    /// host.
    pub async fn stop(self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else { return };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else { return };
        // SHUTDOWN closes the connection instead of answering.
        let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").exec_async(&mut conn).await;
        tracing::info!("stopped the private redis-server");
    }
}

/// Whether a Redis at `url` answers PING.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn answers(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else { return false };
    let connect = tokio::time::timeout(Duration::from_secs(2), client.get_multiplexed_async_connection());
    let Ok(Ok(mut conn)) = connect.await else { return false };
    redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok()
}
