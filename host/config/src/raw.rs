//! The shape of `config.toml`, as serde reads it: unknown keys refused,
//! positions kept for the values that validation checks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::RangeInclusive;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::units::{self, DURATION_FORMS, SIZE_FORMS};
use crate::{
    Config, HttpConfig, Isolation, Limits, NodeConfig, PluginConfig, Problem, RedisConfig, RuntimeConfig,
    ScheduleConfig, Secret, line_of,
};

// The range of every number, size and duration: what `check` enforces
// (config.toml and docs/limits.md list them). They keep values in
// what the code computes with (no overflow, no panic) and in what makes a
// working pool.
const MAX_JOBS: RangeInclusive<u64> = 0..=1_000_000_000;
const MAX_PAYLOAD: RangeInclusive<u64> = 1..=(64 << 20);
const REPLY_TIMEOUT: RangeInclusive<Duration> = millis(10)..=secs(3600);
const MAX_ATTEMPTS: RangeInclusive<u64> = 1..=100;
const RETRY_BACKOFF: RangeInclusive<Duration> = millis(0)..=secs(3600);
const EVENTS_RETENTION: RangeInclusive<u64> = 1..=10_000_000;
const EVENTS_MAX_BYTES: RangeInclusive<u64> = 1..=(16 << 30);
const LEASE_TTL: RangeInclusive<Duration> = millis(400)..=secs(3600);
const SHUTDOWN_TIMEOUT: RangeInclusive<Duration> = millis(100)..=secs(3600);
const MAX_INSTANCES: RangeInclusive<u64> = 1..=100_000;
const MEMORY: RangeInclusive<u64> = (64 << 10)..=(4 << 30);
const CALL_TIMEOUT: RangeInclusive<Duration> = millis(1)..=secs(3600);
const FUEL: RangeInclusive<u64> = 1..=(1 << 60);
// 0: this host runs none of the pool's jobs; it dispatches into it (its API
// answers for it) while other hosts run them.
const WORKERS: RangeInclusive<u64> = 0..=1000;
const INTERVAL: RangeInclusive<Duration> = millis(10)..=secs(86_400);
const MAX_BODY: RangeInclusive<u64> = 1..=(1 << 30);
const HTTP_TIMEOUT: RangeInclusive<Duration> = millis(100)..=secs(3600);
const MAX_CONNECTIONS: RangeInclusive<u64> = 1..=100_000;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    #[serde(default)]
    redis: Redis,
    #[serde(default)]
    node: Node,
    #[serde(default)]
    runtime: Runtime,
    #[serde(default)]
    plugin: Vec<Plugin>,
    #[serde(default)]
    schedule: Vec<Schedule>,
    http: Option<Http>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Http {
    listen: Option<Spanned<String>>,
    token: Option<Spanned<String>>,
    token_file: Option<Spanned<String>>,
    max_body: Option<Spanned<String>>,
    allowed_hosts: Option<Vec<Spanned<String>>>,
    header_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Redis {
    url: Option<String>,
    data_dir: Option<String>,
    tls_ca_file: Option<Spanned<String>>,
    tls_cert_file: Option<Spanned<String>>,
    tls_key_file: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Node {
    max_jobs: Option<Spanned<u64>>,
    max_payload: Option<Spanned<String>>,
    reply_timeout: Option<Spanned<String>>,
    max_attempts: Option<Spanned<u64>>,
    retry_backoff: Option<Spanned<String>>,
    events_retention: Option<Spanned<u64>>,
    events_max_bytes: Option<Spanned<String>>,
    lease_ttl: Option<Spanned<String>>,
    shutdown_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Runtime {
    max_instances: Option<Spanned<u64>>,
    max_memory_per_instance: Option<Spanned<String>>,
    cache_dir: Option<String>,
    fuel: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plugin {
    name: Spanned<String>,
    path: Spanned<String>,
    pool: Option<Spanned<String>>,
    workers: Option<Spanned<u64>>,
    isolation: Option<Spanned<String>>,
    #[serde(default)]
    limits: PluginLimits,
    #[serde(default)]
    settings: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Schedule {
    name: Spanned<String>,
    path: Spanned<String>,
    pool: Spanned<String>,
    interval: Spanned<String>,
    #[serde(default)]
    limits: PluginLimits,
    #[serde(default)]
    settings: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PluginLimits {
    memory: Option<Spanned<String>>,
    call_timeout: Option<Spanned<String>>,
    fuel: Option<Spanned<u64>>,
    instances: Option<Spanned<u64>>,
}

/// Collects problems while reading values.
struct Check<'a> {
    text: &'a str,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn problem<T>(&mut self, spanned: &Spanned<T>, message: String) {
        self.problems.push(Problem { line: Some(line_of(self.text, spanned.span().start)), message });
    }

    /// A duration within `range`, or `default` when absent (or wrong:
    /// then a problem says what is allowed).
    fn duration(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: Duration,
        range: RangeInclusive<Duration>,
    ) -> Duration {
        let unit = Unit {
            what: "a duration",
            forms: DURATION_FORMS,
            parse: units::duration,
            show: units::show_duration,
        };
        self.ranged(key, value, default, &range, &unit)
    }

    /// A value written as a string with a unit, within `range`.
    fn ranged<T: PartialOrd + Copy>(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: T,
        range: &RangeInclusive<T>,
        unit: &Unit<T>,
    ) -> T {
        let Some(value) = value else { return default };
        let text = value.get_ref();
        match (unit.parse)(text) {
            None => {
                self.problem(value, format!("`{key}` = {text:?} is not {}: write {}", unit.what, unit.forms));
                default
            }
            Some(parsed) if !range.contains(&parsed) => {
                let (low, high) = ((unit.show)(*range.start()), (unit.show)(*range.end()));
                self.problem(
                    value,
                    format!("`{key}` = {text:?} is out of range: allowed are {low} to {high}"),
                );
                default
            }
            Some(parsed) => parsed,
        }
    }

    /// A number within `range`, or `default` when absent (or out of range:
    /// then a problem says what is allowed).
    fn count(
        &mut self,
        key: &str,
        value: Option<&Spanned<u64>>,
        default: u64,
        range: RangeInclusive<u64>,
    ) -> u64 {
        let Some(value) = value else { return default };
        let number = *value.get_ref();
        if range.contains(&number) {
            return number;
        }
        self.problem(
            value,
            format!("`{key}` = {number} is out of range: allowed are {} to {}", range.start(), range.end()),
        );
        default
    }

    /// A plugin's or schedule's `limits`, checked against the runtime's.
    fn limits(
        &mut self,
        what: &str,
        name: &Spanned<String>,
        limits: &PluginLimits,
        runtime: &RuntimeConfig,
    ) -> Limits {
        let checked = Limits {
            memory: self.size("limits.memory", limits.memory.as_ref(), 64 << 20, MEMORY),
            call_timeout: self.duration(
                "limits.call_timeout",
                limits.call_timeout.as_ref(),
                secs(10),
                CALL_TIMEOUT,
            ),
            fuel: limits.fuel.as_ref().map(|fuel| self.count("limits.fuel", Some(fuel), 1, FUEL)),
            // Shared out once every plugin is read (`share_instances`).
            instances: 0,
        };
        if checked.memory > runtime.max_memory_per_instance
            && let Some(memory) = &limits.memory
        {
            self.problem(
                memory,
                format!(
                    "{what} {:?}: limits.memory exceeds runtime.max_memory_per_instance ({} bytes)",
                    name.get_ref(),
                    runtime.max_memory_per_instance
                ),
            );
        }
        if checked.fuel.is_some() && !runtime.fuel {
            self.problem(name, format!("{what} {:?}: limits.fuel needs runtime.fuel = true", name.get_ref()));
        }
        checked
    }

    /// A component file, resolved against the config's folder.
    fn component(
        &mut self,
        what: &str,
        name: &str,
        base: &Path,
        path: &Spanned<String>,
    ) -> std::path::PathBuf {
        let context = format!("{what} {name:?}");
        self.existing(base, path, &context, " (build plugins with scripts/build-plugins)")
    }

    /// A file the host reads at start (`key` names it), resolved against
    /// the config's folder.
    fn file(&mut self, key: &str, base: &Path, path: &Spanned<String>) -> std::path::PathBuf {
        self.existing(base, path, &format!("`{key}`"), "")
    }

    /// `path` resolved against `base`; a problem, naming `context` and
    /// ending with `hint`, when no file is there.
    fn existing(
        &mut self,
        base: &Path,
        path: &Spanned<String>,
        context: &str,
        hint: &str,
    ) -> std::path::PathBuf {
        let resolved = base.join(path.get_ref());
        if !resolved.is_file() {
            self.problem(path, format!("{context}: no file at {}{hint}", resolved.display()));
        }
        resolved
    }

    /// A pool, ticker or plugin name.
    fn name(&mut self, what: &str, name: &Spanned<String>) -> bool {
        let valid = valid_name(name.get_ref());
        if !valid {
            self.problem(
                name,
                format!(
                    "{what} name {:?}: allowed are 1 to 100 ASCII letters, digits, '-', '_' or '.'",
                    name.get_ref()
                ),
            );
        }
        valid
    }

    /// A size within `range`, or `default` when absent (or wrong: then a
    /// problem says what is allowed).
    fn size(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: u64,
        range: RangeInclusive<u64>,
    ) -> u64 {
        let unit = Unit { what: "a size", forms: SIZE_FORMS, parse: units::size, show: units::show_size };
        self.ranged(key, value, default, &range, &unit)
    }
}

/// How values of one kind are written: for [`Check::ranged`].
struct Unit<T> {
    what: &'static str,
    forms: &'static str,
    parse: fn(&str) -> Option<T>,
    show: fn(T) -> String,
}

impl Check<'_> {
    /// Each plugin's and schedule's instance quota: the ones given, and an
    /// even share of what `runtime.max_instances` leaves for the others.
    /// The quotas may not add up to more than `max_instances`, so no pool
    /// can take the instances another one needs.
    fn share_instances(&mut self, max_instances: u32, quotas: &[Option<Spanned<u64>>]) -> Vec<u32> {
        let max = u64::from(max_instances);
        for quota in quotas.iter().flatten() {
            self.count("limits.instances", Some(quota), 1, 1..=max);
        }
        let given: u64 = quotas.iter().flatten().map(|q| *q.get_ref()).sum();
        let unset = quotas.iter().filter(|q| q.is_none()).count() as u64;
        let left = max.saturating_sub(given);
        if given > max || (unset > 0 && left < unset) {
            let message = format!(
                "the plugins' and schedules' `limits.instances` add up to {given}, and {unset} more need at least one each: \
                     `runtime.max_instances` is {max}; lower them or raise it"
            );
            match quotas.iter().flatten().last() {
                Some(at) => self.problem(at, message),
                None => self.problems.push(Problem { line: None, message }),
            }
        }
        let share = left.checked_div(unset).map_or(0, |share| share.max(1));
        quotas.iter().map(|q| q.as_ref().map_or(share, |q| *q.get_ref()) as u32).collect()
    }

    /// `[http]`: the address (a port alone means loopback), the token, the
    /// body limit.
    fn http(&mut self, http: &Http, base: &Path) -> HttpConfig {
        let default_listen = std::net::SocketAddr::from(([127, 0, 0, 1], 7070));
        let listen = match &http.listen {
            None => default_listen,
            Some(value) => {
                let text = value.get_ref().trim();
                let parsed = text
                    .parse::<u16>()
                    .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
                    .or_else(|_| text.parse::<std::net::SocketAddr>());
                parsed.unwrap_or_else(|_| {
                    self.problem(
                        value,
                        format!(
                            "`http.listen` = {text:?} is not an address: write an IP and a port \
                             (\"127.0.0.1:7070\", \"0.0.0.0:7070\", \"[::1]:7070\") or a port alone for loopback"
                        ),
                    );
                    default_listen
                })
            }
        };
        let token = match (&http.token, &http.token_file) {
            (Some(_), Some(file)) => {
                self.problem(file, "`http.token` and `http.token_file` are both set: keep one".into());
                None
            }
            (Some(token), None) => self.token(token, token.get_ref(), "`http.token`"),
            (None, Some(file)) => {
                let path = base.join(file.get_ref());
                match std::fs::read_to_string(&path) {
                    Ok(text) => self.token(file, text.trim(), &format!("the token in {}", path.display())),
                    Err(error) => {
                        self.problem(
                            file,
                            format!("`http.token_file`: cannot read {}: {error}", path.display()),
                        );
                        None
                    }
                }
            }
            (None, None) => None,
        };
        let max_body = self.size("http.max_body", http.max_body.as_ref(), 4 << 20, MAX_BODY);
        let allowed_hosts = http
            .allowed_hosts
            .iter()
            .flatten()
            .filter_map(|host| {
                let name = host.get_ref().trim().to_ascii_lowercase();
                let valid = !name.is_empty()
                    && name.len() <= 253
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '[' | ']'));
                if !valid {
                    self.problem(
                        host,
                        format!("`http.allowed_hosts` entry {:?}: write a host name or address, such as \"pulse.example.com\"", host.get_ref()),
                    );
                }
                valid.then_some(name)
            })
            .collect();
        HttpConfig {
            listen,
            token,
            max_body,
            allowed_hosts,
            header_timeout: self.duration(
                "http.header_timeout",
                http.header_timeout.as_ref(),
                secs(10),
                HTTP_TIMEOUT,
            ),
            idle_timeout: self.duration(
                "http.idle_timeout",
                http.idle_timeout.as_ref(),
                secs(60),
                HTTP_TIMEOUT,
            ),
            max_connections: self.count(
                "http.max_connections",
                http.max_connections.as_ref(),
                1024,
                MAX_CONNECTIONS,
            ) as u32,
        }
    }

    /// The HTTP token written in the config (`http.token`) or read from
    /// `http.token_file`.
    fn token(&mut self, at: &Spanned<String>, text: &str, what: &str) -> Option<Secret> {
        match crate::check_token(text) {
            Ok(()) => Some(Secret::new(text)),
            Err(allowed) => {
                self.problem(at, format!("{what} {allowed}"));
                None
            }
        }
    }
}

impl File {
    pub(crate) fn validate(self, base: &Path, text: &str) -> Result<Config, Vec<Problem>> {
        let mut check = Check { text, problems: Vec::new() };
        let node = NodeConfig {
            max_jobs: check.count("node.max_jobs", self.node.max_jobs.as_ref(), 0, MAX_JOBS),
            max_payload: check.size("node.max_payload", self.node.max_payload.as_ref(), 1 << 20, MAX_PAYLOAD),
            reply_timeout: check.duration(
                "node.reply_timeout",
                self.node.reply_timeout.as_ref(),
                secs(10),
                REPLY_TIMEOUT,
            ),
            max_attempts: check.count("node.max_attempts", self.node.max_attempts.as_ref(), 3, MAX_ATTEMPTS)
                as u32,
            retry_backoff: check.duration(
                "node.retry_backoff",
                self.node.retry_backoff.as_ref(),
                millis(100),
                RETRY_BACKOFF,
            ),
            events_retention: check.count(
                "node.events_retention",
                self.node.events_retention.as_ref(),
                10_000,
                EVENTS_RETENTION,
            ),
            events_max_bytes: check.size(
                "node.events_max_bytes",
                self.node.events_max_bytes.as_ref(),
                64 << 20,
                EVENTS_MAX_BYTES,
            ),
            lease_ttl: check.duration("node.lease_ttl", self.node.lease_ttl.as_ref(), secs(10), LEASE_TTL),
            shutdown_timeout: check.duration(
                "node.shutdown_timeout",
                self.node.shutdown_timeout.as_ref(),
                secs(30),
                SHUTDOWN_TIMEOUT,
            ),
        };
        if node.events_max_bytes < node.max_payload
            && let Some(value) = &self.node.events_max_bytes
        {
            check.problem(
                value,
                format!(
                    "`node.events_max_bytes` must be at least `node.max_payload` ({}), or no event fits",
                    units::show_size(node.max_payload)
                ),
            );
        }
        let runtime = RuntimeConfig {
            max_instances: check.count(
                "runtime.max_instances",
                self.runtime.max_instances.as_ref(),
                1000,
                MAX_INSTANCES,
            ) as u32,
            max_memory_per_instance: check.size(
                "runtime.max_memory_per_instance",
                self.runtime.max_memory_per_instance.as_ref(),
                64 << 20,
                MEMORY,
            ),
            cache_dir: self.runtime.cache_dir.map(|dir| base.join(dir)),
            fuel: self.runtime.fuel.unwrap_or(false),
        };
        let mut names = HashSet::new();
        let mut pools: HashMap<String, String> = HashMap::new();
        let mut plugins = Vec::new();
        let mut quotas = Vec::new();
        for plugin in self.plugin {
            let name = plugin.name.get_ref().clone();
            if check.name("plugin", &plugin.name) && !names.insert(name.clone()) {
                check.problem(
                    &plugin.name,
                    format!("plugin name {name:?} is used twice; names must be unique"),
                );
            }
            let path = check.component("plugin", &name, base, &plugin.path);
            let pool = match &plugin.pool {
                Some(pool) if !check.name("pool", pool) => name.clone(),
                Some(pool) => pool.get_ref().clone(),
                None => name.clone(),
            };
            if let Some(other) = pools.insert(pool.clone(), name.clone()) {
                check.problem(
                    plugin.pool.as_ref().unwrap_or(&plugin.name),
                    format!(
                        "plugin {name:?} serves pool {pool:?}, which plugin {other:?} serves already: a pool is served by one plugin"
                    ),
                );
            }
            let isolation = match plugin.isolation.as_ref().map(|i| (i, i.get_ref().as_str())) {
                None | Some((_, "job")) => Isolation::Job,
                Some((_, "worker")) => Isolation::Worker,
                Some((spanned, other)) => {
                    check.problem(
                        spanned,
                        format!("`isolation` = {other:?}: allowed are \"job\" and \"worker\""),
                    );
                    Isolation::Job
                }
            };
            let limits = check.limits("plugin", &plugin.name, &plugin.limits, &runtime);
            quotas.push(plugin.limits.instances.clone());
            plugins.push(PluginConfig {
                name,
                path,
                pool,
                workers: check.count("workers", plugin.workers.as_ref(), 1, WORKERS) as u32,
                isolation,
                limits,
                settings: plugin.settings,
            });
        }
        let mut schedule_names = HashSet::new();
        let mut schedules = Vec::new();
        for schedule in self.schedule {
            let name = schedule.name.get_ref().clone();
            let pool = schedule.pool.get_ref().clone();
            if check.name("schedule", &schedule.name)
                && check.name("pool", &schedule.pool)
                && !schedule_names.insert((pool.clone(), name.clone()))
            {
                check.problem(
                    &schedule.name,
                    format!("schedule {name:?} of pool {pool:?} is declared twice; a pool's schedules need unique names"),
                );
            }
            let path = check.component("schedule", &name, base, &schedule.path);
            let interval = check.duration("interval", Some(&schedule.interval), secs(1), INTERVAL);
            let limits = check.limits("schedule", &schedule.name, &schedule.limits, &runtime);
            quotas.push(schedule.limits.instances.clone());
            schedules.push(ScheduleConfig {
                name,
                path,
                pool,
                interval,
                limits,
                settings: schedule.settings,
            });
        }
        let shares = check.share_instances(runtime.max_instances, &quotas);
        let all_limits =
            plugins.iter_mut().map(|p| &mut p.limits).chain(schedules.iter_mut().map(|s| &mut s.limits));
        for (limits, share) in all_limits.zip(shares) {
            limits.instances = share;
        }
        let http = self.http.map(|http| check.http(&http, base));
        let tls_ca_file =
            self.redis.tls_ca_file.as_ref().map(|file| check.file("redis.tls_ca_file", base, file));
        let tls_client = match (&self.redis.tls_cert_file, &self.redis.tls_key_file) {
            (Some(cert), Some(key)) => Some((
                check.file("redis.tls_cert_file", base, cert),
                check.file("redis.tls_key_file", base, key),
            )),
            (Some(one), None) | (None, Some(one)) => {
                check.problem(
                    one,
                    "`redis.tls_cert_file` and `redis.tls_key_file` go together: set both".into(),
                );
                None
            }
            (None, None) => None,
        };
        if !check.problems.is_empty() {
            // In file order; those without a line last.
            check.problems.sort_by_key(|problem| problem.line.unwrap_or(usize::MAX));
            return Err(check.problems);
        }
        let data_dir = base.join(self.redis.data_dir.unwrap_or_else(|| ".pulse-host".into()));
        Ok(Config {
            path: Default::default(),
            redis: RedisConfig { url: self.redis.url.map(Secret::new), data_dir, tls_ca_file, tls_client },
            node,
            runtime,
            plugins,
            schedules,
            http,
        })
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

const fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::parse;

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let text = "[node]\nreply_timeout = \"10 days\"\n\n[[plugin]]\nname = \"a\"\npath = \"missing.wasm\"\nisolation = \"thread\"\n";
        let error = parse(Path::new("/tmp/x/config.toml"), text).unwrap_err();
        let lines: Vec<_> = error.problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [Some(2), Some(6), Some(7)], "{error}");
        let message = error.to_string();
        assert!(
            message.contains("config.toml:2: `node.reply_timeout` = \"10 days\" is not a duration"),
            "{message}"
        );
        assert!(message.contains("allowed are \"job\" and \"worker\""), "{message}");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_line() {
        let error = parse(Path::new("c.toml"), "[node]\nmax_jbos = 3\n").unwrap_err();
        assert_eq!(error.problems[0].line, Some(2));
        assert!(error.to_string().contains("unknown field `max_jbos`"), "{error}");
    }

    #[test]
    fn defaults_fill_what_is_absent() {
        let config = parse(Path::new("/etc/pulse/config.toml"), "").unwrap();
        assert_eq!(config.node.max_attempts, 3);
        assert_eq!(config.runtime.max_instances, 1000);
        assert_eq!(config.redis.url, None);
        assert_eq!(config.redis.data_dir, Path::new("/etc/pulse/.pulse-host"));
        assert!(config.plugins.is_empty());
        assert_eq!(config.node.lease_ttl, std::time::Duration::from_secs(10));
    }

    #[test]
    fn schedules_are_checked_like_plugins() {
        let text = "[[schedule]]\nname = \"keep\"\npath = \"missing.wasm\"\npool = \"a b\"\ninterval = \"5ms\"\n\n\
                    [[schedule]]\nname = \"x\"\npath = \"m.wasm\"\npool = \"p\"\ninterval = \"1s\"\nwhen = 3\n";
        let error = parse(Path::new("/tmp/x/config.toml"), text).unwrap_err();
        assert!(error.to_string().contains("unknown field `when`"), "{error}");
        let error = parse(Path::new("/tmp/x/config.toml"), text.split("\n\n").next().unwrap()).unwrap_err();
        let lines: Vec<_> = error.problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [Some(3), Some(4), Some(5)], "{error}");
        let message = error.to_string();
        assert!(message.contains("pool name \"a b\": allowed are"), "{message}");
        assert!(message.contains("schedule \"keep\": no file at"), "{message}");
        assert!(
            message.contains("`interval` = \"5ms\" is out of range: allowed are 10ms to 24h"),
            "{message}"
        );
    }

    #[test]
    fn http_is_off_unless_its_section_is_there() {
        let config = parse(Path::new("c.toml"), "").unwrap();
        assert_eq!(config.http, None);
        let config = parse(Path::new("c.toml"), "[http]\n").unwrap();
        let http = config.http.unwrap();
        assert_eq!(http.listen.to_string(), "127.0.0.1:7070");
        assert_eq!((http.token, http.max_body), (None, 4 << 20));
        let config = parse(Path::new("c.toml"), "[http]\nlisten = \"8081\"\nmax_body = \"64KiB\"\n").unwrap();
        let http = config.http.unwrap();
        assert_eq!((http.listen.to_string(), http.max_body), ("127.0.0.1:8081".to_owned(), 64 << 10));
    }

    #[test]
    fn bad_http_settings_are_refused_with_their_lines() {
        let text = "[http]\nlisten = \"localhost\"\ntoken = \"short\"\nmax_body = \"0B\"\n";
        let error = parse(Path::new("c.toml"), text).unwrap_err().to_string();
        assert!(error.contains("c.toml:2: `http.listen` = \"localhost\" is not an address"), "{error}");
        assert!(error.contains("c.toml:3: `http.token` must be 16 to 4,096 printable"), "{error}");
        assert!(
            error.contains("c.toml:4: `http.max_body` = \"0B\" is out of range: allowed are 1B to 1GiB"),
            "{error}"
        );
    }

    #[test]
    fn a_lease_too_short_to_renew_is_refused() {
        let config = parse(Path::new("c.toml"), "[node]\nlease_ttl = \"2s\"\n").unwrap();
        assert_eq!(config.node.lease_ttl, std::time::Duration::from_secs(2));
        let error = parse(Path::new("c.toml"), "[node]\nlease_ttl = \"100ms\"\n").unwrap_err();
        assert_eq!(error.problems[0].line, Some(2));
        assert!(
            error
                .to_string()
                .contains("`node.lease_ttl` = \"100ms\" is out of range: allowed are 400ms to 1h"),
            "{error}"
        );
    }

    #[test]
    fn values_that_would_overflow_or_never_work_are_refused_with_their_lines() {
        let text = "[node]\nretry_backoff = \"18446744073709551615s\"\nlease_ttl = \"5124095576030431h\"\n\
                    reply_timeout = \"0ms\"\nmax_payload = \"0B\"\nevents_retention = 0\nmax_attempts = 0\n\
                    shutdown_timeout = \"0s\"\n[runtime]\nmax_instances = 0\nmax_memory_per_instance = \"16GiB\"\n";
        let error = parse(Path::new("c.toml"), text).unwrap_err();
        let lines: Vec<_> = error.problems.iter().map(|p| p.line).collect();
        assert_eq!(
            lines,
            [Some(2), Some(3), Some(4), Some(5), Some(6), Some(7), Some(8), Some(10), Some(11)],
            "{error}"
        );
        let message = error.to_string();
        assert!(
            message.contains(
                "`node.retry_backoff` = \"18446744073709551615s\" is out of range: allowed are 0ms to 1h"
            ),
            "{message}"
        );
        assert!(
            message.contains("`node.events_retention` = 0 is out of range: allowed are 1 to 10000000"),
            "{message}"
        );
        let text = "[node]\nmax_payload = \"16GiB\"\n\n[[plugin]]\nname = \"a\"\npath = \"Cargo.toml\"\nworkers = 1001\n\
                    [plugin.limits]\nmemory = \"0B\"\n";
        let error = parse(Path::new("c.toml"), text).unwrap_err();
        let lines: Vec<_> = error.problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [Some(2), Some(7), Some(9)], "{error}");
    }

    #[test]
    fn a_pool_is_served_by_one_plugin() {
        let text = "[[plugin]]\nname = \"a\"\npath = \"Cargo.toml\"\npool = \"p\"\n\n\
                    [[plugin]]\nname = \"b\"\npath = \"Cargo.toml\"\npool = \"p\"\n";
        let error = parse(Path::new("c.toml"), text).unwrap_err();
        assert_eq!(error.problems.len(), 1, "{error}");
        assert_eq!(error.problems[0].line, Some(9));
        assert!(
            error.to_string().contains("plugin \"b\" serves pool \"p\", which plugin \"a\" serves already"),
            "{error}"
        );
    }

    #[test]
    fn instances_are_shared_out_so_no_pool_takes_them_all() {
        let plugin = |name: &str, quota: &str| {
            format!("[[plugin]]\nname = \"{name}\"\npath = \"Cargo.toml\"\n{quota}\n")
        };
        let text = format!(
            "[runtime]\nmax_instances = 100\n{}{}{}",
            plugin("a", ""),
            plugin("b", ""),
            plugin("c", "[plugin.limits]\ninstances = 40")
        );
        let config = parse(Path::new("c.toml"), &text).unwrap();
        let shares: Vec<u32> = config.plugins.iter().map(|p| p.limits.instances).collect();
        assert_eq!(shares, [30, 30, 40]);
        let text = format!(
            "[runtime]\nmax_instances = 100\n{}{}",
            plugin("a", ""),
            plugin("c", "[plugin.limits]\ninstances = 100")
        );
        let error = parse(Path::new("c.toml"), &text).unwrap_err().to_string();
        assert!(error.contains("add up to 100, and 1 more need at least one each"), "{error}");
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let text =
            "[redis]\nurl = \"redis://:hunter2hunter2@h/\"\n[http]\ntoken = \"abcdefghijklmnopqrstuvwxyz\"\n";
        let config = parse(Path::new("c.toml"), text).unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("abcdefghijklmnop"), "{shown}");
        assert_eq!(config.http.unwrap().token.unwrap().expose(), "abcdefghijklmnopqrstuvwxyz");
    }
}
