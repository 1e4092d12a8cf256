//! The shape of `config.toml`, as serde reads it: unknown keys refused,
//! positions kept for the values that validation checks.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::units::{self, DURATION_FORMS, SIZE_FORMS};
use crate::{
    Config, HttpConfig, Isolation, Limits, NodeConfig, PluginConfig, Problem, RedisConfig, RuntimeConfig,
    ScheduleConfig, line_of,
};

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
    max_body: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Redis {
    url: Option<String>,
    data_dir: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Node {
    max_jobs: Option<u64>,
    max_payload: Option<Spanned<String>>,
    reply_timeout: Option<Spanned<String>>,
    max_attempts: Option<Spanned<u32>>,
    retry_backoff: Option<Spanned<String>>,
    events_retention: Option<u64>,
    lease_ttl: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Runtime {
    max_instances: Option<Spanned<u32>>,
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
    workers: Option<u32>,
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
    fuel: Option<u64>,
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

    fn duration(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: std::time::Duration,
    ) -> std::time::Duration {
        let Some(value) = value else { return default };
        units::duration(value.get_ref()).unwrap_or_else(|| {
            self.problem(
                value,
                format!("`{key}` = {:?} is not a duration: write {DURATION_FORMS}", value.get_ref()),
            );
            default
        })
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
            memory: self.size("limits.memory", limits.memory.as_ref(), 64 << 20),
            call_timeout: self.duration("limits.call_timeout", limits.call_timeout.as_ref(), secs(10)),
            fuel: limits.fuel,
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
        let resolved = base.join(path.get_ref());
        if !resolved.is_file() {
            self.problem(
                path,
                format!(
                    "{what} {name:?}: no file at {} (build plugins with scripts/build-plugins)",
                    resolved.display()
                ),
            );
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

    fn size(&mut self, key: &str, value: Option<&Spanned<String>>, default: u64) -> u64 {
        let Some(value) = value else { return default };
        units::size(value.get_ref()).unwrap_or_else(|| {
            self.problem(value, format!("`{key}` = {:?} is not a size: write {SIZE_FORMS}", value.get_ref()));
            default
        })
    }
}

impl Check<'_> {
    /// `[http]`: the address (a port alone means loopback), the token, the
    /// body limit.
    fn http(&mut self, http: &Http) -> HttpConfig {
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
        let token = http.token.as_ref().and_then(|token| {
            let text = token.get_ref();
            let valid = text.len() >= 16 && text.bytes().all(|b| b.is_ascii_graphic());
            if !valid {
                self.problem(
                    token,
                    "`http.token` must be at least 16 printable ASCII characters, without spaces".into(),
                );
            }
            valid.then(|| text.clone())
        });
        let max_body = self.size("http.max_body", http.max_body.as_ref(), 4 << 20);
        if let Some(value) = &http.max_body
            && max_body == 0
        {
            self.problem(value, "`http.max_body` must be more than 0".into());
        }
        HttpConfig { listen, token, max_body }
    }
}

impl File {
    pub(crate) fn validate(self, base: &Path, text: &str) -> Result<Config, Vec<Problem>> {
        let mut check = Check { text, problems: Vec::new() };
        let node = NodeConfig {
            max_jobs: self.node.max_jobs.unwrap_or(0),
            max_payload: check.size("node.max_payload", self.node.max_payload.as_ref(), 1 << 20),
            reply_timeout: check.duration("node.reply_timeout", self.node.reply_timeout.as_ref(), secs(10)),
            max_attempts: match &self.node.max_attempts {
                Some(n) if *n.get_ref() == 0 => {
                    check.problem(n, "`node.max_attempts` must be at least 1".into());
                    1
                }
                Some(n) => *n.get_ref(),
                None => 3,
            },
            retry_backoff: check.duration(
                "node.retry_backoff",
                self.node.retry_backoff.as_ref(),
                millis(100),
            ),
            events_retention: self.node.events_retention.unwrap_or(10_000),
            lease_ttl: {
                let ttl = check.duration("node.lease_ttl", self.node.lease_ttl.as_ref(), secs(10));
                match &self.node.lease_ttl {
                    Some(value) if ttl < millis(400) => {
                        check.problem(
                            value,
                            "`node.lease_ttl` must be at least 400ms (it is renewed every quarter of it)"
                                .into(),
                        );
                        secs(10)
                    }
                    _ => ttl,
                }
            },
        };
        let runtime = RuntimeConfig {
            max_instances: match &self.runtime.max_instances {
                Some(n) if *n.get_ref() == 0 => {
                    check.problem(n, "`runtime.max_instances` must be at least 1".into());
                    1
                }
                Some(n) => *n.get_ref(),
                None => 1000,
            },
            max_memory_per_instance: check.size(
                "runtime.max_memory_per_instance",
                self.runtime.max_memory_per_instance.as_ref(),
                64 << 20,
            ),
            cache_dir: self.runtime.cache_dir.map(|dir| base.join(dir)),
            fuel: self.runtime.fuel.unwrap_or(false),
        };
        let mut names = HashSet::new();
        let mut plugins = Vec::new();
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
            plugins.push(PluginConfig {
                name,
                path,
                pool,
                workers: plugin.workers.unwrap_or(1),
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
            let interval = check.duration("interval", Some(&schedule.interval), secs(1));
            if interval < millis(10) {
                check.problem(
                    &schedule.interval,
                    format!("schedule {name:?}: `interval` must be at least 10ms"),
                );
            }
            let limits = check.limits("schedule", &schedule.name, &schedule.limits, &runtime);
            schedules.push(ScheduleConfig {
                name,
                path,
                pool,
                interval,
                limits,
                settings: schedule.settings,
            });
        }
        let http = self.http.map(|http| check.http(&http));
        if !check.problems.is_empty() {
            return Err(check.problems);
        }
        let data_dir = base.join(self.redis.data_dir.unwrap_or_else(|| ".pulse-host".into()));
        Ok(Config {
            path: Default::default(),
            redis: RedisConfig { url: self.redis.url, data_dir },
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

fn secs(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n)
}

fn millis(n: u64) -> std::time::Duration {
    std::time::Duration::from_millis(n)
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
        assert_eq!(lines, [Some(4), Some(3), Some(5)], "{error}");
        let message = error.to_string();
        assert!(message.contains("pool name \"a b\": allowed are"), "{message}");
        assert!(message.contains("schedule \"keep\": no file at"), "{message}");
        assert!(message.contains("`interval` must be at least 10ms"), "{message}");
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
        assert!(error.contains("c.toml:3: `http.token` must be at least 16"), "{error}");
        assert!(error.contains("c.toml:4: `http.max_body` must be more than 0"), "{error}");
    }

    #[test]
    fn a_lease_too_short_to_renew_is_refused() {
        let config = parse(Path::new("c.toml"), "[node]\nlease_ttl = \"2s\"\n").unwrap();
        assert_eq!(config.node.lease_ttl, std::time::Duration::from_secs(2));
        let error = parse(Path::new("c.toml"), "[node]\nlease_ttl = \"100ms\"\n").unwrap_err();
        assert_eq!(error.problems[0].line, Some(2));
        assert!(error.to_string().contains("`node.lease_ttl` must be at least 400ms"), "{error}");
    }
}
