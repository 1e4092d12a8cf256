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
    /// one cluster with `redis-cli --cluster create` (by hand below 3
    /// masters, without replicas), and waits until every
    /// node says the cluster is `ok` and every replica is in sync. Nodes give up on a silent peer after
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
        if masters < 3 {
            return Self::assemble(nodes, masters, replicas);
        }
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
        // A replica still in its first sync acknowledges nothing.
        for node in &cluster.nodes[masters..] {
            wait_for(node.port(), &["INFO", "replication"], |info| info.contains("master_link_status:up"));
        }
        cluster
    }

    /// A cluster of fewer than 3 masters, which `redis-cli --cluster
    /// create` refuses: each master takes an equal range of slots, and
    /// the others meet the first.
    fn assemble(nodes: Vec<RedisServer>, masters: usize, replicas: usize) -> Self {
        assert!(masters >= 1 && replicas == 0, "fewer than 3 masters: without replicas only");
        let step = 16_384 / masters;
        for (index, node) in nodes.iter().enumerate() {
            let first = index * step;
            let last = if index + 1 == masters { 16_383 } else { first + step - 1 };
            let added =
                cli(node.port(), &["CLUSTER", "ADDSLOTSRANGE", &first.to_string(), &last.to_string()]);
            assert_eq!(
                added.as_deref().map(str::trim),
                Some("OK"),
                "port {}: CLUSTER ADDSLOTSRANGE",
                node.port()
            );
            if index > 0 {
                cli(node.port(), &["CLUSTER", "MEET", "127.0.0.1", &nodes[0].port().to_string()]);
            }
        }
        let cluster = Self { nodes, masters };
        for node in &cluster.nodes {
            wait_for(node.port(), &["CLUSTER", "INFO"], |info| {
                info.contains("cluster_state:ok") && info.contains(&format!("cluster_known_nodes:{masters}"))
            });
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

    /// The index (in [`RedisCluster::nodes`]) of the master that serves
    /// `key`'s slot now: the one running node that answers for the key
    /// rather than redirecting (`MOVED`) to another.
    ///
    /// # Panics
    /// When no running node serves it.
    pub fn serving(&self, key: &str) -> usize {
        self.serving_now(key).unwrap_or_else(|| panic!("no running node serves {key}"))
    }

    /// [`RedisCluster::serving`], or none while no running node serves
    /// the slot (its master died and no replica took over yet).
    fn serving_now(&self, key: &str) -> Option<usize> {
        self.nodes.iter().position(|node| {
            node.pid().is_some()
                && cli(node.port(), &["EXISTS", key])
                    .is_some_and(|answer| answer.trim().parse::<u64>().is_ok())
        })
    }

    /// The index of a replica of master `master`.
    ///
    /// # Panics
    /// When it has none.
    pub fn replica_of(&self, master: usize) -> usize {
        let port = self.nodes[master].port().to_string();
        self.nodes
            .iter()
            .position(|node| {
                cli(node.port(), &["ROLE"]).is_some_and(|role| {
                    let mut lines = role.lines().map(str::trim);
                    lines.next() == Some("slave") && lines.nth(1) == Some(port.as_str())
                })
            })
            .unwrap_or_else(|| panic!("node {master} has no replica"))
    }

    /// Fails master `master` over to its replica gracefully (`CLUSTER
    /// FAILOVER` on the replica: the master stops taking writes, the
    /// replica catches up and takes over), and waits until the replica
    /// says it is a master. Returns the replica's index.
    ///
    /// # Panics
    /// When the master has no replica or the failover does not finish.
    pub fn fail_over(&self, master: usize) -> usize {
        let replica = self.replica_of(master);
        let answer = cli(self.nodes[replica].port(), &["CLUSTER", "FAILOVER"]).unwrap_or_default();
        assert_eq!(answer.trim(), "OK", "CLUSTER FAILOVER on node {replica}");
        wait_for(self.nodes[replica].port(), &["ROLE"], |role| role.starts_with("master"));
        replica
    }

    /// Moves the slot of `key` to master `to` as `redis-cli --cluster
    /// reshard` would, while clients keep using it: the slot is marked
    /// importing on `to` and migrating on its master, its keys move a
    /// few at a time (`MIGRATE`; meanwhile a client is sent `ASK` or
    /// `TRYAGAIN`), then every master is told its new node.
    ///
    /// # Panics
    /// When a step fails.
    pub fn migrate_slot_of(&self, key: &str, to: usize) {
        let from = self.serving(key);
        assert_ne!(from, to, "node {to} serves {key} already");
        let (source, target) = (self.nodes[from].port(), self.nodes[to].port());
        let id = |port| cli(port, &["CLUSTER", "MYID"]).unwrap_or_default().trim().to_owned();
        let (source_id, target_id) = (id(source), id(target));
        let slot = cli(source, &["CLUSTER", "KEYSLOT", key]).unwrap_or_default().trim().to_owned();
        let ok = |port, args: &[&str]| {
            let answer = cli(port, args).unwrap_or_default();
            assert_eq!(answer.trim(), "OK", "port {port}: {args:?} answered {answer:?}");
        };
        ok(target, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
        ok(source, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
        loop {
            let keys = cli(source, &["CLUSTER", "GETKEYSINSLOT", &slot, "5"]).unwrap_or_default();
            let keys: Vec<&str> = keys.lines().map(str::trim).filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let target_port = target.to_string();
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &target_port, "", "0", "5000", "KEYS"];
            migrate.extend(&keys);
            let answer = cli(source, &migrate).unwrap_or_default();
            assert!(matches!(answer.trim(), "OK" | "NOKEY"), "MIGRATE answered {answer:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        for node in &self.nodes[..self.masters] {
            if node.pid().is_some() {
                ok(node.port(), &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
            }
        }
    }

    /// Waits until every running node says the cluster is `ok` again, and
    /// some node other than `dead` serves `key` (after a master's kill:
    /// its replica was promoted).
    ///
    /// # Panics
    /// When the cluster does not settle.
    pub fn wait_for_promotion(&self, key: &str, dead: usize) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while self.nodes.iter().enumerate().any(|(i, node)| {
            i != dead
                && !cli(node.port(), &["CLUSTER", "INFO"]).unwrap_or_default().contains("cluster_state:ok")
        }) || self.serving_now(key).is_none_or(|node| node == dead)
        {
            assert!(Instant::now() < deadline, "no replica took over {key} from node {dead}");
            std::thread::sleep(Duration::from_millis(50));
        }
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
        let replica = start_replica(&primary);
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

    /// Waits until the sentinels name `servers[server]` the primary.
    ///
    /// # Panics
    /// When they do not within a minute.
    pub fn wait_for_primary(&self, server: usize) {
        let (port, deadline) = (self.servers[server].port(), Instant::now() + SETTLE_TIMEOUT);
        while self.primary_port() != port {
            assert!(Instant::now() < deadline, "the sentinels never named port {port} the primary");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Starts a replica of `primary` (a TCP server) and waits until it is in
/// sync.
///
/// # Panics
/// When it does not start or sync within a minute.
pub fn start_replica(primary: &RedisServer) -> RedisServer {
    let replica = RedisServer::start_tcp_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    wait_for(replica.port(), &["INFO", "replication"], |info| info.contains("master_link_status:up"));
    replica
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
