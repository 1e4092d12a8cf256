//! Local Redis deployments of several servers: a Redis Cluster and a
//! primary with a replica behind Sentinel, each of private
//! `redis-server` processes (see [`RedisServer`]) that a test can kill,
//! pause and fail over.

use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// How long a deployment may take to settle (a cluster to cover every
/// slot, sentinels to find each other and the replica).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The name the sentinels monitor their primary under.
pub const MASTER_NAME: &str = "pulse-primary";

/// A local Redis Cluster: masters first, then their replicas.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    masters: usize,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, joined into
    /// one cluster with `redis-cli --cluster create`, and waits until every
    /// node says the cluster is `ok`. Nodes give up on a silent peer after
    /// a second (`cluster-node-timeout`), so a killed master's replica is
    /// promoted within a few seconds.
    ///
    /// # Panics
    /// When a server does not start, or the cluster does not form.
    pub fn start(masters: usize, replicas: usize) -> Self {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "1000",
            "--cluster-config-file",
            "nodes.conf",
        ];
        let nodes: Vec<RedisServer> =
            (0..masters * (1 + replicas)).map(|_| RedisServer::start_tcp_with(&args)).collect();
        let mut create = std::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let output =
            create.output().expect("failed to run redis-cli (it comes with redis-server: redis-tools)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Self { nodes, masters };
        for node in &cluster.nodes {
            wait_for(node.port(), &["CLUSTER", "INFO"], |info| info.contains("cluster_state:ok"));
        }
        cluster
    }

    /// The cluster's URL, naming every master as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> =
            self.nodes[..self.masters].iter().map(|node| format!("127.0.0.1:{}", node.port())).collect();
        format!("redis+cluster://{}/", seeds.join(","))
    }

    /// Every node, masters first (as started: a failover swaps roles).
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }
}

/// A primary and its replica behind three sentinels (quorum two) that
/// judge a primary down after a second of silence.
#[derive(Debug)]
pub struct RedisSentinels {
    /// The primary first, then the replica (as started: a failover swaps
    /// their roles).
    pub servers: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Starts the servers and the sentinels, and waits until the replica
    /// is in sync and every sentinel knows the replica and the other
    /// sentinels, so that a failover can happen.
    ///
    /// # Panics
    /// When a server does not start, or the set does not settle.
    pub fn start() -> Self {
        let primary = RedisServer::start_tcp_with(&[]);
        let port = primary.port().to_string();
        let replica = RedisServer::start_tcp_with(&["--replicaof", "127.0.0.1", &port]);
        wait_for(replica.port(), &["INFO", "replication"], |info| info.contains("master_link_status:up"));
        let config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 10000\n"
        );
        let sentinels: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_sentinel(&config)).collect();
        for sentinel in &sentinels {
            wait_for(sentinel.port(), &["SENTINEL", "REPLICAS", MASTER_NAME], |replicas| {
                replicas.contains("ip")
            });
            wait_for(sentinel.port(), &["SENTINEL", "SENTINELS", MASTER_NAME], |others| {
                others.matches("runid").count() >= 2
            });
        }
        Self { servers: vec![primary, replica], sentinels }
    }

    /// The URL naming the sentinels and the primary's name.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The port of the primary the sentinels name now.
    ///
    /// # Panics
    /// When no sentinel answers.
    pub fn primary_port(&self) -> u16 {
        for sentinel in &self.sentinels {
            if let Some(answer) = cli(sentinel.port(), &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
                && let Some(port) = answer.lines().nth(1).and_then(|p| p.trim().parse().ok())
            {
                return port;
            }
        }
        panic!("no sentinel named a primary")
    }
}

/// What `redis-cli -p port args…` prints, or none when it failed.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Waits until what `redis-cli` prints for `args` passes `ready`.
fn wait_for(port: u16, args: &[&str], ready: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let answer = cli(port, args).unwrap_or_default();
        if ready(&answer) {
            return;
        }
        assert!(Instant::now() < deadline, "port {port}: {args:?} still answers {answer:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
