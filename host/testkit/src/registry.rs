//! [`Registry`]: a private OCI registry (Debian's `docker-registry`, the
//! CNCF distribution server) on a free loopback port, storing in a
//! temporary folder, for tests of plugins pulled from a registry.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::free_port;

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
        Self::spawn(false)
    }

    /// A registry that asks for [`USER`] and [`PASSWORD`] (HTTP Basic).
    pub fn start_with_auth() -> Self {
        Self::spawn(true)
    }

    fn spawn(auth: bool) -> Self {
        let binary = std::env::var("PULSE_REGISTRY").unwrap_or_else(|_| "docker-registry".into());
        let dir = tempfile::tempdir().expect("a temporary folder");
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if auth {
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, HTPASSWD).expect("write htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: pulse-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).expect("write the registry's config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("create the registry's log");
        let process = Command::new(&binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone a file handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start {binary:?} ({error}): install Debian's docker-registry (.ci/run does) or set PULSE_REGISTRY")
            });
        let registry = Self { dir, port, process };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the registry did not listen: {}", registry.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        registry
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
