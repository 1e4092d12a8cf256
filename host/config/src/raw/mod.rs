//! The shape of `config.toml`, as serde reads it: unknown keys refused,
//! positions kept for the values that validation checks.

mod check;
mod choice;
mod setting;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::RangeInclusive;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use check::Check;
use setting::RawSetting;
use toml::Spanned;

use crate::units::{self, DURATION_FORMS, SIZE_FORMS};
use crate::{
    Config, Defaults, HttpConfig, Isolation, Limits, NodeConfig, PluginConfig, Problem, RedisConfig,
    RuntimeConfig, ScheduleConfig, Secret, Source, TelemetryConfig, Upgrade, line_of,
};

// The range of every number, size and duration: what `check` enforces
// (config.toml and docs/limits.md list them). They keep values in
// what the code computes with (no overflow, no panic) and in what makes a
// working pool.
const MAX_JOBS: RangeInclusive<u64> = 0..=1_000_000_000;
const MAX_PAYLOAD: RangeInclusive<u64> = 1..=(64 << 20);
const REPLY_TIMEOUT: RangeInclusive<Duration> = millis(10)..=secs(3600);
const RESPONSE_TIMEOUT: RangeInclusive<Duration> = millis(100)..=secs(600);
const MAX_ATTEMPTS: RangeInclusive<u64> = 1..=100;
const CONFIRM_REPLICAS: RangeInclusive<u64> = 0..=16;
/// The most slot groups (`pulse_pool`'s limit).
const SLOT_GROUPS: u64 = 64;
const RETRY_BACKOFF: RangeInclusive<Duration> = millis(0)..=secs(3600);
const EVENTS_RETENTION: RangeInclusive<u64> = 1..=10_000_000;
const EVENTS_MAX_BYTES: RangeInclusive<u64> = 1..=(16 << 30);
const LEASE_TTL: RangeInclusive<Duration> = millis(400)..=secs(3600);
const SHUTDOWN_TIMEOUT: RangeInclusive<Duration> = millis(100)..=secs(3600);
const MAX_INSTANCES: RangeInclusive<u64> = 1..=1_000_000;
/// `pulse_runtime::MAX_READY_INSTANCES`.
const READY_INSTANCES: RangeInclusive<u64> = 0..=64;
/// `runtime.threads` (0: `TOKIO_WORKER_THREADS`, else one per core).
const THREADS: RangeInclusive<u64> = 0..=1_024;
const MEMORY: RangeInclusive<u64> = (64 << 10)..=(4 << 30);
const CALL_TIMEOUT: RangeInclusive<Duration> = millis(1)..=secs(3600);
const FUEL: RangeInclusive<u64> = 1..=(1 << 60);
const OUTBOUND_TIMEOUT: RangeInclusive<Duration> = millis(1)..=secs(3600);
const HTTP_BODY_BYTES: RangeInclusive<u64> = 1..=(1 << 30);
const HTTP_REQUESTS: RangeInclusive<u64> = 1..=1000;
// 0: this host runs none of the pool's jobs; it dispatches into it (its API
// answers for it) while other hosts run them.
const WORKERS: RangeInclusive<u64> = 0..=1000;
const MAX_CONCURRENT_CALLS: RangeInclusive<u64> = 1..=10_000;
/// `upgrade_window` when not set.
const DEFAULT_UPGRADE_WINDOW: Duration = secs(30);
/// `upgrade_max_failed_percent` when not set.
const DEFAULT_UPGRADE_MAX_FAILED_PERCENT: u64 = 5;
const UPGRADE_WINDOW: RangeInclusive<Duration> = secs(0)..=secs(3600);
const UPGRADE_MAX_FAILED_PERCENT: RangeInclusive<u64> = 0..=100;
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
    telemetry: Option<Telemetry>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Telemetry {
    otlp_endpoint: Option<Spanned<String>>,
    service_name: Option<Spanned<String>>,
    sample_ratio: Option<Spanned<f64>>,
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
    tls_cert_file: Option<Spanned<String>>,
    tls_key_file: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Redis {
    url: Option<String>,
    data_dir: Option<String>,
    tls_ca_file: Option<Spanned<String>>,
    tls_cert_file: Option<Spanned<String>>,
    tls_key_file: Option<Spanned<String>>,
    response_timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Node {
    max_jobs: Option<Spanned<u64>>,
    max_payload: Option<Spanned<String>>,
    reply_timeout: Option<Spanned<String>>,
    confirm_replicas: Option<Spanned<u64>>,
    slot_groups: Option<Spanned<u64>>,
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
    ready_instances: Option<Spanned<u64>>,
    threads: Option<Spanned<u64>>,
    max_memory_per_instance: Option<Spanned<String>>,
    memory_reservation: Option<Spanned<String>>,
    cache_dir: Option<String>,
    fuel: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plugin {
    name: Spanned<String>,
    path: Spanned<String>,
    allow_tags: Option<Spanned<bool>>,
    verify: Option<Spanned<Verify>>,
    pool: Option<Spanned<String>>,
    workers: Option<Spanned<u64>>,
    isolation: Option<Spanned<String>>,
    version: Option<Spanned<String>>,
    upgrade: Option<Spanned<String>>,
    upgrade_window: Option<Spanned<String>>,
    upgrade_max_failed_percent: Option<Spanned<u64>>,
    max_concurrent_calls: Option<Spanned<u64>>,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    outbound_ca_file: Option<Spanned<String>>,
    outbound_fence_header: Option<Spanned<String>>,
    #[serde(default)]
    limits: PluginLimits,
    #[serde(default)]
    settings: BTreeMap<String, Spanned<RawSetting>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Schedule {
    name: Spanned<String>,
    path: Spanned<String>,
    allow_tags: Option<Spanned<bool>>,
    verify: Option<Spanned<Verify>>,
    pool: Spanned<String>,
    interval: Spanned<String>,
    #[serde(default)]
    allowed_outbound_hosts: Vec<String>,
    outbound_ca_file: Option<Spanned<String>>,
    #[serde(default)]
    limits: PluginLimits,
    #[serde(default)]
    settings: BTreeMap<String, Spanned<RawSetting>>,
}

/// `verify = { key = "cosign.pub" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Verify {
    key: Spanned<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PluginLimits {
    memory: Option<Spanned<String>>,
    call_timeout: Option<Spanned<String>>,
    fuel: Option<Spanned<u64>>,
    instances: Option<Spanned<u64>>,
    http_connect_timeout: Option<Spanned<String>>,
    http_first_byte_timeout: Option<Spanned<String>>,
    http_request_bytes: Option<Spanned<String>>,
    http_response_bytes: Option<Spanned<String>>,
    http_requests: Option<Spanned<u64>>,
}

impl File {
    pub(crate) fn validate(
        self,
        base: &Path,
        text: &str,
        defaults: &Defaults,
    ) -> Result<Config, Vec<Problem>> {
        let mut check = Check { text, problems: Vec::new(), defaults };
        let d = &defaults.node;
        let node = NodeConfig {
            max_jobs: check.count("node.max_jobs", self.node.max_jobs.as_ref(), d.max_jobs, MAX_JOBS),
            max_payload: check.size(
                "node.max_payload",
                self.node.max_payload.as_ref(),
                d.max_payload,
                MAX_PAYLOAD,
            ),
            reply_timeout: check.duration(
                "node.reply_timeout",
                self.node.reply_timeout.as_ref(),
                d.reply_timeout,
                REPLY_TIMEOUT,
            ),
            confirm_replicas: check.count(
                "node.confirm_replicas",
                self.node.confirm_replicas.as_ref(),
                d.confirm_replicas.into(),
                CONFIRM_REPLICAS,
            ) as u32,
            slot_groups: check.power_of_two(
                "node.slot_groups",
                self.node.slot_groups.as_ref(),
                d.slot_groups.into(),
                SLOT_GROUPS,
            ) as u32,
            max_attempts: check.count(
                "node.max_attempts",
                self.node.max_attempts.as_ref(),
                d.max_attempts.into(),
                MAX_ATTEMPTS,
            ) as u32,
            retry_backoff: check.duration(
                "node.retry_backoff",
                self.node.retry_backoff.as_ref(),
                d.retry_backoff,
                RETRY_BACKOFF,
            ),
            events_retention: check.count(
                "node.events_retention",
                self.node.events_retention.as_ref(),
                d.events_retention,
                EVENTS_RETENTION,
            ),
            events_max_bytes: check.size(
                "node.events_max_bytes",
                self.node.events_max_bytes.as_ref(),
                d.events_max_bytes,
                EVENTS_MAX_BYTES,
            ),
            lease_ttl: check.duration("node.lease_ttl", self.node.lease_ttl.as_ref(), d.lease_ttl, LEASE_TTL),
            shutdown_timeout: check.duration(
                "node.shutdown_timeout",
                self.node.shutdown_timeout.as_ref(),
                d.shutdown_timeout,
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
                defaults.runtime.max_instances.into(),
                MAX_INSTANCES,
            ) as u32,
            ready_instances: check.count(
                "runtime.ready_instances",
                self.runtime.ready_instances.as_ref(),
                defaults.runtime.ready_instances.into(),
                READY_INSTANCES,
            ) as u32,
            threads: check.count(
                "runtime.threads",
                self.runtime.threads.as_ref(),
                defaults.runtime.threads.into(),
                THREADS,
            ) as u32,
            max_memory_per_instance: check.size(
                "runtime.max_memory_per_instance",
                self.runtime.max_memory_per_instance.as_ref(),
                defaults.runtime.max_memory_per_instance,
                MEMORY,
            ),
            memory_reservation: check.size(
                "runtime.memory_reservation",
                self.runtime.memory_reservation.as_ref(),
                defaults.runtime.memory_reservation,
                MEMORY,
            ),
            cache_dir: self
                .runtime
                .cache_dir
                .map(|dir| base.join(dir))
                .or_else(|| defaults.runtime.cache_dir.clone()),
            fuel: self.runtime.fuel.unwrap_or(defaults.runtime.fuel),
        };
        if runtime.memory_reservation < runtime.max_memory_per_instance
            && let Some(reservation) = &self.runtime.memory_reservation
        {
            check.problem(
                reservation,
                format!(
                    "`runtime.memory_reservation` ({} bytes) must be at least runtime.max_memory_per_instance \
                     ({} bytes): a memory grows within its reservation",
                    runtime.memory_reservation, runtime.max_memory_per_instance
                ),
            );
        }
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
            let source = check.component(
                "plugin",
                &name,
                base,
                &plugin.path,
                (plugin.allow_tags.as_ref(), plugin.verify.as_ref()),
                runtime.cache_dir.is_some(),
            );
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
            let isolation = check.choice(
                "isolation",
                plugin.isolation.as_ref(),
                &[("job", Isolation::Job), ("worker", Isolation::Worker)],
            );
            let upgrade = check.choice(
                "upgrade",
                plugin.upgrade.as_ref(),
                &[("rolling", Upgrade::Rolling), ("refuse", Upgrade::Refuse)],
            );
            let version = match &plugin.version {
                Some(version) if check.name("version", version) => version.get_ref().clone(),
                _ => String::new(),
            };
            let limits = check.limits("plugin", &plugin.name, &plugin.limits, &runtime);
            quotas.push(plugin.limits.instances.clone());
            plugins.push(PluginConfig {
                name,
                source,
                pool,
                workers: check.count("workers", plugin.workers.as_ref(), 1, WORKERS) as u32,
                isolation,
                version,
                upgrade,
                upgrade_window: check.duration(
                    "upgrade_window",
                    plugin.upgrade_window.as_ref(),
                    DEFAULT_UPGRADE_WINDOW,
                    UPGRADE_WINDOW,
                ),
                upgrade_max_failed_percent: check.count(
                    "upgrade_max_failed_percent",
                    plugin.upgrade_max_failed_percent.as_ref(),
                    DEFAULT_UPGRADE_MAX_FAILED_PERCENT,
                    UPGRADE_MAX_FAILED_PERCENT,
                ) as u32,
                max_concurrent_calls: check.count(
                    "max_concurrent_calls",
                    plugin.max_concurrent_calls.as_ref(),
                    defaults.max_concurrent_calls as u64,
                    MAX_CONCURRENT_CALLS,
                ) as usize,
                allowed_outbound_hosts: plugin.allowed_outbound_hosts,
                outbound_ca_file: plugin
                    .outbound_ca_file
                    .as_ref()
                    .map(|file| check.file("outbound_ca_file", base, file)),
                outbound_fence_header: check.fence_header(plugin.outbound_fence_header.as_ref()),
                limits,
                settings: check.settings(base, plugin.settings),
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
            let source = check.component(
                "schedule",
                &name,
                base,
                &schedule.path,
                (schedule.allow_tags.as_ref(), schedule.verify.as_ref()),
                runtime.cache_dir.is_some(),
            );
            let interval = check.duration("interval", Some(&schedule.interval), secs(1), INTERVAL);
            let limits = check.limits("schedule", &schedule.name, &schedule.limits, &runtime);
            quotas.push(schedule.limits.instances.clone());
            schedules.push(ScheduleConfig {
                name,
                source,
                pool,
                interval,
                allowed_outbound_hosts: schedule.allowed_outbound_hosts,
                outbound_ca_file: schedule
                    .outbound_ca_file
                    .as_ref()
                    .map(|file| check.file("outbound_ca_file", base, file)),
                limits,
                settings: check.settings(base, schedule.settings),
            });
        }
        let shares = check.share_instances(runtime.max_instances, &quotas);
        let all_limits =
            plugins.iter_mut().map(|p| &mut p.limits).chain(schedules.iter_mut().map(|s| &mut s.limits));
        for (limits, share) in all_limits.zip(shares) {
            limits.instances = share;
        }
        let http = self.http.map(|http| check.http(&http, base));
        let telemetry = self.telemetry.and_then(|telemetry| check.telemetry(&telemetry));
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
        let response_timeout = check.duration(
            "redis.response_timeout",
            self.redis.response_timeout.as_ref(),
            defaults.redis_response_timeout,
            RESPONSE_TIMEOUT,
        );
        if !check.problems.is_empty() {
            // In file order; those without a line last.
            check.problems.sort_by_key(|problem| problem.line.unwrap_or(usize::MAX));
            return Err(check.problems);
        }
        let data_dir = base.join(self.redis.data_dir.unwrap_or_else(|| ".pulse-host".into()));
        Ok(Config {
            path: Default::default(),
            redis: RedisConfig {
                url: self.redis.url.map(Secret::new),
                data_dir,
                tls_ca_file,
                tls_client,
                response_timeout,
            },
            node,
            runtime,
            plugins,
            schedules,
            http,
            telemetry,
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
