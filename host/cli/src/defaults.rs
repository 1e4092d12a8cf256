//! What a key left out of config.toml takes: the default of the library
//! that uses it (the pool, the runtime, the HTTP server), handed to the
//! config crate, so each default is written once. A test checks that
//! config.toml documents the same values.

use std::path::Path;

use pulse_config::{Config, ConfigError, Defaults, HttpDefaults, Limits, NodeConfig, RuntimeConfig};
use pulse_pool::{NodeOptions, WorkerOptions};

/// Reads and validates config.toml at `path`.
///
/// # Errors
/// [`ConfigError`] with every problem found.
pub fn load_config(path: &Path) -> Result<Config, ConfigError> {
    pulse_config::load(path, &defaults())
}

/// The libraries' defaults, as config values.
pub fn defaults() -> Defaults {
    let node = NodeOptions::default();
    let runtime = pulse_runtime::RuntimeConfig::default();
    let limits = pulse_runtime::Limits::default();
    let outbound = pulse_runtime::Outbound::default();
    let api = pulse_http::ApiOptions::default();
    let serve = pulse_http::ServeOptions::default();
    Defaults {
        node: NodeConfig {
            max_jobs: node.max_jobs,
            max_payload: node.max_payload as u64,
            reply_timeout: node.reply_timeout,
            confirm_replicas: node.confirm_replicas,
            slot_groups: node.slot_groups,
            max_attempts: node.max_attempts,
            retry_backoff: node.retry_backoff,
            events_retention: node.events_retention as u64,
            events_max_bytes: node.events_max_bytes,
            lease_ttl: node.lease_ttl,
            shutdown_timeout: node.shutdown_timeout,
        },
        runtime: RuntimeConfig {
            max_instances: runtime.instance_ceiling(),
            ready_instances: runtime.ready_ceiling(),
            threads: 0,
            max_memory_per_instance: runtime.memory_ceiling(),
            memory_reservation: runtime.reservation(),
            cache_dir: None,
            fuel: runtime.fuel_enabled(),
        },
        limits: Limits {
            memory: limits.memory,
            call_timeout: limits.call_timeout,
            fuel: limits.fuel,
            // Each plugin's share of `runtime.max_instances`.
            instances: 0,
            http_connect_timeout: outbound.connect_timeout,
            http_first_byte_timeout: outbound.first_byte_timeout,
            http_request_bytes: outbound.max_request_bytes,
            http_response_bytes: outbound.max_response_bytes,
            http_requests: outbound.max_requests,
        },
        max_concurrent_calls: WorkerOptions::default().max_concurrent_calls,
        http: HttpDefaults {
            max_body: api.max_body as u64,
            header_timeout: serve.header_timeout,
            idle_timeout: serve.idle_timeout,
            max_connections: u32::try_from(serve.max_connections).unwrap_or(u32::MAX),
        },
        redis_response_timeout: pulse_redis::DEFAULT_RESPONSE_TIMEOUT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The section `header` of config.toml (up to the next table), whose
    /// values are the documented defaults.
    fn documented(header: &str) -> String {
        let file = include_str!("../../../config.toml");
        let start =
            file.find(&format!("\n{header}\n")).unwrap_or_else(|| panic!("config.toml has no {header}"));
        let section = &file[start + 1..];
        let end = section[header.len()..].find("\n[").map_or(section.len(), |end| end + header.len());
        section[..end].to_owned()
    }

    /// config.toml documents the libraries' defaults: a file that writes
    /// out every documented value reads as one that leaves them all out.
    #[test]
    fn config_toml_documents_the_libraries_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
        // The first plugin's `max_concurrent_calls` line documents its default.
        let calls = documented("[[plugin]]");
        let calls = calls.lines().find(|line| line.starts_with("max_concurrent_calls")).unwrap();
        let plugin = format!(
            "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n{calls}\n{}",
            documented("[plugin.limits]")
        );
        let http = documented("[http]");
        // What the documented [http] section sets beyond limits (listen,
        // token) is not a default; only its limits are compared.
        let http_limits: String = http
            .lines()
            .filter(|line| {
                ["max_body", "header_timeout", "idle_timeout", "max_connections"]
                    .iter()
                    .any(|key| line.starts_with(key))
            })
            .map(|line| format!("{line}\n"))
            .collect();
        // Of [redis], only its one limit: the rest names a deployment.
        let redis = documented("[redis]");
        let redis_limit = redis.lines().find(|line| line.starts_with("response_timeout")).unwrap();
        let written = format!(
            "[redis]\n{redis_limit}\n{}\n{}\n[http]\n{http_limits}\n{plugin}",
            documented("[node]"),
            documented("[runtime]")
        );
        let absent = "[http]\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n";
        let path = dir.path().join("config.toml");
        let written = pulse_config::parse(&path, &written, &defaults()).unwrap();
        let absent = pulse_config::parse(&path, absent, &defaults()).unwrap();
        assert_eq!(written.node, absent.node, "[node]");
        assert_eq!(written.runtime, absent.runtime, "[runtime]");
        assert_eq!(written.plugins, absent.plugins, "[[plugin]] and [plugin.limits]");
        assert_eq!(written.http, absent.http, "[http]");
        assert_eq!(written.redis, absent.redis, "[redis]");
        assert_eq!(http_limits.lines().count(), 4, "config.toml documents [http]'s limits: {http}");
    }
}
