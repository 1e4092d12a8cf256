//! [`Registry`]: a private OCI registry (Debian's `docker-registry`, the
//! CNCF distribution server) on a free loopback port, storing in a
//! temporary folder, for tests of plugins pulled from a registry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::{free_port, until_a_port_holds};

/// The user of [`Registry::start_with_auth`].
pub const USER: &str = "alice";
/// Its password.
pub const PASSWORD: &str = "s3cret";
/// `htpasswd -Bbn alice s3cret` (bcrypt, as the registry requires).
const HTPASSWD: &str = "alice:$2y$05$/gvC6fjPzYBp6h4vts7Ff.MCp/3JixmCYKg6RbXYw6qqT6GcdU9QS\n";

/// A running `docker-registry`, stopped when dropped.
#[derive(Debug)]
pub struct Registry {
    dir: tempfile::TempDir,
    port: u16,
    process: Child,
}

impl Registry {
    /// A registry anyone may read and write.
    pub fn start() -> Self {
        Self::spawn(false, free_port)
    }

    /// A registry that asks for [`USER`] and [`PASSWORD`] (HTTP Basic).
    pub fn start_with_auth() -> Self {
        Self::spawn(true, free_port)
    }

    fn spawn(auth: bool, mut ports: impl FnMut() -> u16) -> Self {
        until_a_port_holds(|| {
            let dir = tempfile::tempdir().expect("a temporary folder");
            let port = ports();
            let process = Self::spawn_on(dir.path(), port, auth);
            let mut registry = Self { dir, port, process };
            match registry.wait_listening() {
                Ok(()) => Ok(registry),
                Err(failure) => Err(format!("the registry {failure}: {}", registry.log())),
            }
        })
    }

    /// Writes the registry's configuration for `port` into `dir` and
    /// starts it.
    fn spawn_on(dir: &Path, port: u16, auth: bool) -> Child {
        let binary = std::env::var("PULSE_REGISTRY").unwrap_or_else(|_| "docker-registry".into());
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        if auth {
            let htpasswd = dir.join("htpasswd");
            std::fs::write(&htpasswd, HTPASSWD).expect("write htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: pulse-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config).expect("write the registry's config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("create the registry's log");
        Command::new(&binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start {binary:?} ({error}): install Debian's docker-registry (.ci/run does) or set PULSE_REGISTRY")
            })
    }

    /// Whether a registry answers on its port: `GET /v2/` answered with
    /// the registry's API header (with or without auth). Another process
    /// may have taken the port (a listener that never answers, a server
    /// of another kind): that does not count.
    fn answers(&self) -> bool {
        use std::io::{Read as _, Write as _};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        // Short: a registry slow to answer is asked again.
        if stream.set_read_timeout(Some(Duration::from_millis(250))).is_err()
            || stream.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n").is_err()
        {
            return false;
        }
        let mut answer = Vec::new();
        let _ = stream.take(64 << 10).read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).to_ascii_lowercase().contains("docker-distribution-api-version")
    }

    /// Waits until the registry listens; or says how it ended.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.process.try_wait() {
                return Err(format!("exited with {status} before it listened"));
            }
            if self.answers() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("did not listen within 30 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `oci://127.0.0.1:PORT/NAME`.
    pub fn reference(&self, name: &str) -> String {
        format!("oci://{}/{name}", self.address())
    }

    /// Where it stores blobs and manifests.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_whose_port_was_taken_starts_on_another() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let taken_port = taken.local_addr().expect("a bound listener has an address").port();
        let mut offered = vec![taken_port];
        let registry = Registry::spawn(false, || offered.pop().unwrap_or_else(free_port));
        assert_ne!(registry.port, taken_port);
        assert!(registry.answers(), "the registry answers on port {}", registry.port);
        assert!(offered.is_empty(), "the taken port was tried first");
    }
}
