//! The URL forms, their settings, and the check that a server is of the
//! form its URL names.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, TlsCertificates, TlsMode};

/// The URL forms, for messages.
const FORMS: &str = "redis://[user:password@]host[:port][/db], rediss://… for TLS, \
     redis+unix:///path/to/socket, redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db] \
     (rediss+sentinel:// for TLS), redis+cluster://[user:password@]host:port[,host:port…]/ \
     (rediss+cluster:// for TLS)";

/// What went wrong reaching Redis. Messages never hold the URL (it may
/// hold a password): the caller names it, redacted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is of no form this crate knows, or is malformed.
    #[error("{reason} (allowed: {FORMS})")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// The server answers, but is not of the form the URL names.
    #[error("{0}")]
    WrongForm(String),
    /// Redis refused or failed.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

impl From<Error> for redis::RedisError {
    /// For the connections' own errors, which callers handle as Redis's:
    /// a Redis error stays itself, and the rest become client errors with
    /// their message.
    fn from(error: Error) -> Self {
        match error {
            Error::Redis(error) => error,
            other => (redis::ErrorKind::InvalidClientConfig, "no connection", other.to_string()).into(),
        }
    }
}

/// The three forms of deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// One server (`redis://`, `rediss://`, `redis+unix://`).
    Single,
    /// A primary found through Sentinel (`redis+sentinel://`).
    Sentinel,
    /// A Redis Cluster (`redis+cluster://`).
    Cluster,
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single => "a single server",
            Self::Sentinel => "a primary behind Sentinel",
            Self::Cluster => "a Redis Cluster",
        })
    }
}

/// How long a command on a shared connection may wait for its answer
/// unless [`Redis::with_response_timeout`] says otherwise.
///
/// Long enough that a Redis busy for a moment (a large script, a fork, a
/// loaded machine) answers late rather than fails: a command that timed
/// out may still have run, so its caller must treat it as unknown, and a
/// write of a worker's jobs that timed out is counted as dropped. Short
/// enough that a primary that stopped answering without closing its
/// connections (frozen, or cut off by the network) is noticed, and,
/// behind Sentinel, left for the one the sentinels name: their own
/// `down-after-milliseconds` is commonly longer.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where Redis is: cheap to clone, shared by everything in the process;
/// and how long an answer on its shared connections may take.
#[derive(Clone)]
pub struct Redis(pub(crate) Arc<Target>, pub(crate) Duration);

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may hold a password.
        f.debug_tuple("Redis").field(&self.form()).finish()
    }
}

#[expect(clippy::large_enum_variant, reason = "one per process, behind an Arc")]
pub(crate) enum Target {
    Single(redis::Client),
    Sentinel(Sentinel),
    Cluster {
        /// Commands and scripts.
        data: ClusterClient,
        /// Subscriptions: RESP3, whose pushes reach a channel of ours.
        pubsub: ClusterClient,
        /// The doorbells' connection, made with the first doorbell.
        bells: tokio::sync::OnceCell<Arc<crate::doorbell::Bells>>,
    },
}

/// What it takes to ask the sentinels for the current primary.
pub(crate) struct Sentinel {
    sentinels: Vec<ConnectionAddr>,
    master: String,
    tls: Option<TlsCertificates>,
    secure: bool,
    user: Option<String>,
    password: Option<String>,
    db: Option<i64>,
}

/// Every connection sets `TCP_NODELAY`: redis-rs leaves Nagle's algorithm
/// on, which holds a small write back until the previous one is
/// acknowledged; over a real network that costs tens of percent of the
/// pool's throughput.
fn tcp() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidUrl { reason: reason.into() }
}

/// A URL of a multi-host form, cut into its parts.
struct Parts<'a> {
    secure: bool,
    user: Option<&'a str>,
    password: Option<&'a str>,
    hosts: Vec<(String, u16)>,
    path: &'a str,
}

fn parts(rest: &str, secure: bool, default_port: u16) -> Result<Parts<'_>, Error> {
    if rest.contains(['?', '#']) {
        return Err(invalid("a sentinel or cluster URL takes no query"));
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        Some(info) => match info.split_once(':') {
            Some((user, password)) => ((!user.is_empty()).then_some(user), Some(password)),
            None => (None, Some(info)),
        },
        None => (None, None),
    };
    let hosts = hosts.split(',').map(|host| host_port(host, default_port)).collect::<Result<Vec<_>, _>>()?;
    Ok(Parts { secure, user, password, hosts, path })
}

/// One server's URL: `redis://` or `rediss://`, then `userinfo` (empty,
/// or ending in `@`), then the host (an IPv6 one in brackets) and port.
fn node_url(secure: bool, userinfo: &str, (host, port): &(String, u16)) -> String {
    let scheme = if secure { "rediss" } else { "redis" };
    match host.contains(':') {
        true => format!("{scheme}://{userinfo}[{host}]:{port}"),
        false => format!("{scheme}://{userinfo}{host}:{port}"),
    }
}

/// The seeds of a cluster URL (`redis+cluster://`, `rediss+cluster://`),
/// each as a single server's URL with the cluster URL's credentials: to
/// ask a node for its own figures (`INFO`), which the cluster connection
/// answers per node. `None` for the other forms.
///
/// # Errors
/// [`Error::InvalidUrl`] for a cluster URL [`Redis::open`] refuses too.
pub fn cluster_seeds(url: &str) -> Result<Option<Vec<String>>, Error> {
    let Some(("redis+cluster" | "rediss+cluster", rest)) = url.split_once("://") else { return Ok(None) };
    let parts = parts(rest, url.starts_with("rediss"), 6379)?;
    // As the cluster client takes them: a user only beside a password.
    let userinfo = match (parts.user, parts.password) {
        (Some(user), Some(password)) => format!("{user}:{password}@"),
        (None, Some(password)) => format!(":{password}@"),
        _ => String::new(),
    };
    Ok(Some(parts.hosts.iter().map(|host| node_url(parts.secure, &userinfo, host)).collect()))
}

fn host_port(text: &str, default_port: u16) -> Result<(String, u16), Error> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) =
            v6.split_once(']').ok_or_else(|| invalid(format!("host {text:?} lacks its ']'")))?;
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(invalid(format!("an empty host in {text:?}")));
    }
    let port = match port {
        Some(port) => {
            port.parse().map_err(|_| invalid(format!("port {port:?} of host {host:?} is not a number")))?
        }
        None => default_port,
    };
    Ok((host.to_owned(), port))
}

impl Redis {
    /// Where `url` says Redis is, with the system's TLS roots and no
    /// client certificate for a TLS form. Nothing is connected yet.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] naming what is wrong and the forms allowed.
    pub fn open(url: &str) -> Result<Self, Error> {
        Self::open_with_tls(url, None)
    }

    /// Where `url` says Redis is; `tls`, the certificates for a TLS form
    /// (none: the system's roots, no client certificate). Nothing is
    /// connected yet: see [`Redis::verify`].
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] naming what is wrong and the forms allowed.
    pub fn open_with_tls(url: &str, tls: Option<TlsCertificates>) -> Result<Self, Error> {
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| invalid("no scheme (`redis://`, `redis+cluster://`, …)"))?;
        let target = match scheme {
            "redis+sentinel" | "rediss+sentinel" => {
                let parts = parts(rest, scheme.starts_with("rediss"), 26379)?;
                let mut path = parts.path.trim_start_matches('/').split('/');
                let master = path.next().filter(|m| !m.is_empty()).ok_or_else(|| {
                    invalid("a sentinel URL names its master after the hosts: redis+sentinel://host:port/master-name")
                })?;
                let db = match path.next().filter(|db| !db.is_empty()) {
                    Some(db) => {
                        Some(db.parse().map_err(|_| invalid(format!("database {db:?} is not a number")))?)
                    }
                    None => None,
                };
                if path.next().is_some() {
                    return Err(invalid("a sentinel URL's path is /master-name[/db]"));
                }
                let sentinels = parts
                    .hosts
                    .into_iter()
                    .map(|(host, port)| match parts.secure {
                        true => ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None },
                        false => ConnectionAddr::Tcp(host, port),
                    })
                    .collect();
                Target::Sentinel(Sentinel {
                    sentinels,
                    master: master.to_owned(),
                    tls,
                    secure: parts.secure,
                    user: parts.user.map(str::to_owned),
                    password: parts.password.map(str::to_owned),
                    db,
                })
            }
            "redis+cluster" | "rediss+cluster" => {
                let parts = parts(rest, scheme.starts_with("rediss"), 6379)?;
                if !matches!(parts.path, "" | "/") {
                    return Err(invalid("a cluster URL has no path: a cluster has one database"));
                }
                let seeds: Vec<String> =
                    parts.hosts.iter().map(|host| node_url(parts.secure, "", host)).collect();
                let builder = || {
                    let mut builder = ClusterClientBuilder::new(seeds.clone()).tcp_settings(tcp());
                    if let Some(user) = parts.user {
                        builder = builder.username(user);
                    }
                    if let Some(password) = parts.password {
                        builder = builder.password(password);
                    }
                    if parts.secure {
                        builder = builder.tls(TlsMode::Secure);
                        if let Some(tls) = &tls {
                            builder = builder.certs(tls.clone());
                        }
                    }
                    builder
                };
                let build = |builder: ClusterClientBuilder| {
                    builder.build().map_err(|error| invalid(error.to_string()))
                };
                Target::Cluster {
                    data: build(builder())?,
                    pubsub: build(builder().use_protocol(redis::ProtocolVersion::RESP3))?,
                    bells: tokio::sync::OnceCell::new(),
                }
            }
            _ => {
                let info = url.into_connection_info().map_err(|error| invalid(error.to_string()))?;
                let info = info.set_tcp_settings(tcp());
                let client = match tls {
                    Some(tls) if scheme == "rediss" => redis::Client::build_with_tls(info, tls),
                    _ => redis::Client::open(info),
                };
                Target::Single(client.map_err(|error| invalid(error.to_string()))?)
            }
        };
        Ok(Self(Arc::new(target), DEFAULT_RESPONSE_TIMEOUT))
    }

    /// The same Redis, whose shared connections made from now on wait up
    /// to `timeout` for an answer (see [`DEFAULT_RESPONSE_TIMEOUT`]).
    #[must_use]
    pub fn with_response_timeout(self, timeout: Duration) -> Self {
        Self(self.0, timeout)
    }

    /// How long an answer on a shared connection may take.
    pub fn response_timeout(&self) -> Duration {
        self.1
    }

    /// The form of deployment the URL named.
    pub fn form(&self) -> Form {
        match &*self.0 {
            Target::Single(_) => Form::Single,
            Target::Sentinel(_) => Form::Sentinel,
            Target::Cluster { .. } => Form::Cluster,
        }
    }

    /// Connects once and checks the server is of the form the URL names:
    /// a cluster URL must reach a cluster, a single server's URL must not
    /// reach a cluster node or a sentinel, a sentinel URL must name a
    /// master the sentinels know.
    ///
    /// # Errors
    /// [`Error::WrongForm`] saying what answered and which URL form it
    /// needs; [`Error::Redis`] when nothing answers.
    pub async fn verify(&self) -> Result<(), Error> {
        match &*self.0 {
            Target::Cluster { data, .. } => {
                let mut conn = data.get_async_connection().await.map_err(|error| {
                    if error.to_string().contains("cluster support disabled") {
                        Error::WrongForm(
                            "the server is not a Redis Cluster node (cluster support disabled): \
                             name a single server with redis://host:port"
                                .to_owned(),
                        )
                    } else {
                        Error::Redis(error)
                    }
                })?;
                let _: () = redis::cmd("PING").query_async(&mut conn).await?;
            }
            Target::Single(client) => {
                let mut conn = client.get_multiplexed_async_connection().await?;
                let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
                if matches!(role.first(), Some(redis::Value::BulkString(kind)) if kind == b"sentinel") {
                    return Err(Error::WrongForm(
                        "the server is a Sentinel: name it with redis+sentinel://host:port/master-name"
                            .to_owned(),
                    ));
                }
                let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await?;
                if info.lines().any(|line| line.trim() == "cluster_enabled:1") {
                    return Err(Error::WrongForm(
                        "the server is a Redis Cluster node: name the cluster with \
                         redis+cluster://host:port[,host:port…]/"
                            .to_owned(),
                    ));
                }
            }
            Target::Sentinel(sentinel) => {
                let client = sentinel.primary().await?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                let _: () = redis::cmd("PING").query_async(&mut conn).await?;
            }
        }
        Ok(())
    }

    /// A client of the one server commands go to: the server itself, or
    /// the primary the sentinels name now. None on a cluster.
    pub(crate) async fn server(&self) -> redis::RedisResult<Option<redis::Client>> {
        match &*self.0 {
            Target::Single(client) => Ok(Some(client.clone())),
            Target::Sentinel(sentinel) => Ok(Some(sentinel.primary().await?)),
            Target::Cluster { .. } => Ok(None),
        }
    }
}

impl Sentinel {
    /// A client of the primary the sentinels name now.
    pub(crate) async fn primary(&self) -> Result<redis::Client, Error> {
        let mut client = self.client()?;
        client.async_get_client().await.map_err(|error| {
            let text = error.to_string();
            if text.contains("master") || text.contains("No") || text.contains("sentinel") {
                Error::WrongForm(format!(
                    "no sentinel named a primary for master {:?} ({text}): check the master name \
                     (SENTINEL MASTERS on a sentinel lists them) and that the hosts are sentinels",
                    self.master
                ))
            } else {
                Error::Redis(error)
            }
        })
    }

    fn client(&self) -> redis::RedisResult<SentinelClient> {
        let mut builder =
            SentinelClientBuilder::new(self.sentinels.clone(), &self.master, SentinelServerType::Master)?
                .set_client_to_redis_tcp_settings(tcp())
                .set_client_to_sentinel_tcp_settings(tcp());
        if let Some(user) = &self.user {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(db) = self.db {
            builder = builder.set_client_to_redis_db(db);
        }
        if self.secure {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(tls) = &self.tls {
                builder = builder
                    .set_client_to_redis_certificates(tls.clone())
                    .set_client_to_sentinel_certificates(tls.clone());
            }
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_opens() {
        assert_eq!(Redis::open("redis://127.0.0.1:6379/0").map(|r| r.form()).ok(), Some(Form::Single));
        assert_eq!(Redis::open("redis+unix:///tmp/r.sock").map(|r| r.form()).ok(), Some(Form::Single));
        let sentinel = Redis::open("redis+sentinel://u:pw@127.0.0.1:26379,[::1]:26380/mymaster/2");
        assert_eq!(sentinel.map(|r| r.form()).ok(), Some(Form::Sentinel));
        let cluster = Redis::open("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/");
        assert_eq!(cluster.map(|r| r.form()).ok(), Some(Form::Cluster));
    }

    #[test]
    fn a_cluster_url_s_seeds_are_single_servers_with_its_credentials() {
        let seeds = |url| cluster_seeds(url).unwrap();
        assert_eq!(
            seeds("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/"),
            Some(vec!["redis://127.0.0.1:7000".to_owned(), "redis://127.0.0.1:7001".to_owned()])
        );
        assert_eq!(
            seeds("redis+cluster://app:secret@10.0.0.1:7000,10.0.0.2:7000/"),
            Some(vec![
                "redis://app:secret@10.0.0.1:7000".to_owned(),
                "redis://app:secret@10.0.0.2:7000".to_owned()
            ])
        );
        assert_eq!(seeds("rediss+cluster://10.0.0.1:7000/"), Some(vec!["rediss://10.0.0.1:7000".to_owned()]));
        assert_eq!(
            seeds("redis+cluster://pw@[::1]:7000,10.0.0.2/"),
            Some(vec!["redis://:pw@[::1]:7000".to_owned(), "redis://:pw@10.0.0.2:6379".to_owned()])
        );
        assert_eq!(seeds("redis://127.0.0.1:6379"), None);
        assert_eq!(seeds("redis+sentinel://127.0.0.1:26379/main"), None);
        assert_eq!(seeds("redis+unix:///tmp/redis.sock"), None);
        let error = cluster_seeds("redis+cluster://a:1,,b:2/").unwrap_err().to_string();
        assert!(error.contains("empty host"), "{error}");
    }

    #[test]
    fn bad_urls_say_what_is_wrong_and_what_is_allowed() {
        for (url, says) in [
            ("127.0.0.1:6379", "no scheme"),
            ("redis+sentinel://127.0.0.1:26379", "names its master"),
            ("redis+sentinel://127.0.0.1:26379/m/x", "not a number"),
            ("redis+cluster://127.0.0.1:7000/3", "no path"),
            ("redis+cluster://127.0.0.1:x/", "not a number"),
            ("redis+cluster://a:1,,b:2/", "empty host"),
            ("http://127.0.0.1/", "allowed"),
        ] {
            let error = Redis::open(url).expect_err(url).to_string();
            assert!(error.contains(says), "{url}: {error}");
            assert!(error.contains("redis+cluster://"), "{url}: {error}");
            assert!(!error.contains("pw"), "{url}: {error}");
        }
    }
}
