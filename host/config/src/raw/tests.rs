//! The checks of config.toml, against files written here.

use std::path::Path;
use std::time::Duration;

use crate::{Config, ConfigError, Defaults, HttpDefaults, Limits, NodeConfig, RuntimeConfig};

/// What the binary passes in, with values of this test's own: config
/// writes no default of the libraries', it hands on the ones it is given.
fn defaults() -> Defaults {
    Defaults {
        node: NodeConfig {
            max_jobs: 5,
            max_payload: 3 << 20,
            reply_timeout: Duration::from_secs(7),
            confirm_replicas: 2,
            slot_groups: 1,
            max_attempts: 4,
            retry_backoff: Duration::from_millis(30),
            events_retention: 900,
            events_max_bytes: 9 << 20,
            lease_ttl: Duration::from_secs(6),
            shutdown_timeout: Duration::from_secs(11),
        },
        runtime: RuntimeConfig {
            max_instances: 321,
            ready_instances: 5,
            threads: 0,
            max_memory_per_instance: 32 << 20,
            memory_reservation: 1 << 30,
            cache_dir: None,
            fuel: false,
        },
        limits: Limits {
            memory: 16 << 20,
            call_timeout: Duration::from_secs(3),
            fuel: None,
            instances: 0,
            http_connect_timeout: Duration::from_secs(2),
            http_first_byte_timeout: Duration::from_secs(4),
            http_request_bytes: 3 << 20,
            http_response_bytes: 1 << 20,
            http_requests: 3,
        },
        max_concurrent_calls: 12,
        http: HttpDefaults {
            max_body: 2 << 20,
            header_timeout: Duration::from_secs(9),
            idle_timeout: Duration::from_secs(70),
            max_connections: 77,
        },
        redis_response_timeout: Duration::from_millis(2500),
    }
}

fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    crate::parse(path, text, &defaults())
}

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
fn a_memory_reservation_below_the_memory_ceiling_is_refused() {
    let text = "[runtime]\nmax_memory_per_instance = \"64MiB\"\nmemory_reservation = \"32MiB\"\n";
    let error = parse(Path::new("c.toml"), text).unwrap_err();
    assert_eq!(error.problems.iter().map(|p| p.line).collect::<Vec<_>>(), [Some(3)], "{error}");
    assert!(
        error.to_string().contains(
            "`runtime.memory_reservation` (33554432 bytes) must be at least runtime.max_memory_per_instance \
             (67108864 bytes)"
        ),
        "{error}"
    );
    let text = "[runtime]\nmax_instances = 200000\nmax_memory_per_instance = \"16MiB\"\nmemory_reservation = \"16MiB\"\n";
    let config = parse(Path::new("c.toml"), text).unwrap();
    assert_eq!((config.runtime.max_instances, config.runtime.memory_reservation), (200_000, 16 << 20));
}

#[test]
fn ready_instances_are_read_and_bounded() {
    let config = parse(Path::new("c.toml"), "[runtime]\nready_instances = 0\n").unwrap();
    assert_eq!(config.runtime.ready_instances, 0);
    let error = parse(Path::new("c.toml"), "[runtime]\nready_instances = 65\n").unwrap_err();
    assert_eq!(error.problems.iter().map(|p| p.line).collect::<Vec<_>>(), [Some(2)], "{error}");
    assert!(error.to_string().contains("runtime.ready_instances"), "{error}");
}

#[test]
fn threads_are_read_and_bounded() {
    assert_eq!(parse(Path::new("c.toml"), "").unwrap().runtime.threads, 0);
    let config = parse(Path::new("c.toml"), "[runtime]\nthreads = 1\n").unwrap();
    assert_eq!(config.runtime.threads, 1);
    let error = parse(Path::new("c.toml"), "[runtime]\nthreads = 1025\n").unwrap_err();
    assert_eq!(error.problems.iter().map(|p| p.line).collect::<Vec<_>>(), [Some(2)], "{error}");
    assert!(
        error.to_string().contains("`runtime.threads` = 1025 is out of range: allowed are 0 to 1024"),
        "{error}"
    );
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
    let defaults = defaults();
    assert_eq!(config.node, defaults.node);
    assert_eq!(config.runtime, defaults.runtime);
    assert_eq!(config.redis.url, None);
    assert_eq!(config.redis.data_dir, Path::new("/etc/pulse/.pulse-host"));
    assert!(config.plugins.is_empty());
    let text = "[http]\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
    let config = parse(&dir.path().join("config.toml"), text).unwrap();
    let plugin = &config.plugins[0];
    assert_eq!(plugin.max_concurrent_calls, defaults.max_concurrent_calls);
    // `instances` is the plugin's share of `runtime.max_instances`.
    assert_eq!(plugin.limits, Limits { instances: defaults.runtime.max_instances, ..defaults.limits });
    let http = config.http.unwrap();
    let d = defaults.http;
    assert_eq!(
        (http.max_body, http.header_timeout, http.idle_timeout, http.max_connections),
        (d.max_body, d.header_timeout, d.idle_timeout, d.max_connections)
    );
}

#[test]
fn a_plugin_names_its_version_and_how_it_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
    let path = dir.path().join("config.toml");
    let config = parse(&path, "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n").unwrap();
    assert_eq!(
        (config.plugins[0].version.as_str(), config.plugins[0].upgrade),
        ("", crate::Upgrade::Rolling)
    );
    let text = "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nversion = \"2.1.0\"\nupgrade = \"refuse\"\n";
    let config = parse(&path, text).unwrap();
    assert_eq!(
        (config.plugins[0].version.as_str(), config.plugins[0].upgrade),
        ("2.1.0", crate::Upgrade::Refuse)
    );
    let text = "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nversion = \"2 | 1\"\nupgrade = \"eager\"\n";
    let error = parse(&path, text).unwrap_err();
    let lines: Vec<_> = error.problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [Some(4), Some(5)], "{error}");
    let message = error.to_string();
    assert!(message.contains("`upgrade` = \"eager\": allowed are \"rolling\" and \"refuse\""), "{message}");
    assert!(message.contains("version name \"2 | 1\": allowed are"), "{message}");
}

#[test]
fn a_plugin_s_requests_carry_the_fence_in_the_header_it_names_or_none() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
    let path = dir.path().join("config.toml");
    let header = |extra: &str| {
        let text = format!("[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n{extra}");
        parse(&path, &text).map(|config| config.plugins[0].outbound_fence_header.clone())
    };
    assert_eq!(header("").unwrap().as_deref(), Some("pulse-fence"));
    assert_eq!(header("outbound_fence_header = \"X-Fence\"\n").unwrap().as_deref(), Some("x-fence"));
    assert_eq!(header("outbound_fence_header = \"\"\n").unwrap(), None);
    for bad in ["a b", "host", "Content-Length", "fence:"] {
        let error = header(&format!("outbound_fence_header = \"{bad}\"\n")).unwrap_err();
        let message = error.to_string();
        assert_eq!(error.problems[0].line, Some(4), "{message}");
        assert!(message.contains(&format!("outbound_fence_header {bad:?}: allowed are")), "{message}");
        assert!(message.contains("\"\" for no fence header"), "{message}");
    }
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
    assert!(message.contains("`interval` = \"5ms\" is out of range: allowed are 10ms to 24h"), "{message}");
}

#[test]
fn http_is_off_unless_its_section_is_there() {
    let config = parse(Path::new("c.toml"), "").unwrap();
    assert_eq!(config.http, None);
    let config = parse(Path::new("c.toml"), "[http]\n").unwrap();
    let http = config.http.unwrap();
    assert_eq!(http.listen.to_string(), "127.0.0.1:7070");
    assert_eq!((http.token, http.max_body), (None, defaults().http.max_body));
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
        error.to_string().contains("`node.lease_ttl` = \"100ms\" is out of range: allowed are 400ms to 1h"),
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
fn redis_response_timeout_is_read_and_bounded() {
    let config = parse(Path::new("c.toml"), "[redis]\nresponse_timeout = \"750ms\"\n").unwrap();
    assert_eq!(config.redis.response_timeout, Duration::from_millis(750));
    let config = parse(Path::new("c.toml"), "").unwrap();
    assert_eq!(config.redis.response_timeout, Duration::from_millis(2500), "the default handed in");
    let error = parse(Path::new("c.toml"), "[redis]\nresponse_timeout = \"10ms\"\n").unwrap_err();
    assert_eq!(error.problems[0].line, Some(2));
    assert!(
        error
            .to_string()
            .contains("`redis.response_timeout` = \"10ms\" is out of range: allowed are 100ms to 10m"),
        "{error}"
    );
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
    let plugin =
        |name: &str, quota: &str| format!("[[plugin]]\nname = \"{name}\"\npath = \"Cargo.toml\"\n{quota}\n");
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

#[test]
fn settings_come_from_the_file_the_environment_or_a_file_and_those_read_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
    std::fs::write(dir.path().join("key.txt"), "from-a-file\n").unwrap();
    // A variable every test process has (setting one is `unsafe`).
    let variable = "PATH";
    let from_environment = std::env::var(variable).unwrap();
    let text = format!(
        "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n\n[plugin.settings]\nplain = \"written\"\n\
         env = {{ env = \"{variable}\" }}\nfile = {{ file = \"key.txt\" }}\n"
    );
    let config = parse(&dir.path().join("config.toml"), &text).unwrap();
    let settings = &config.plugins[0].settings;
    let values: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.value())).collect();
    assert_eq!(values, [("env", from_environment.as_str()), ("file", "from-a-file"), ("plain", "written")]);
    let printed = format!("{config:?}");
    assert!(!printed.contains(&from_environment) && !printed.contains("from-a-file"), "{printed}");
    assert!(printed.contains("written"), "plain settings stay readable: {printed}");

    let missing = "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n\n[plugin.settings]\n\
                   a = { env = \"PULSE_CONFIG_TEST_NO_SUCH_VARIABLE\" }\nb = { file = \"nope.txt\" }\nc = { vault = \"x\" }\n";
    let error = parse(&dir.path().join("config.toml"), missing).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("config.toml:8"), "the unknown form is refused with its line: {message}");
    assert!(message.contains("a setting is a string"), "it says what is allowed: {message}");
    let number = "[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n\n[plugin.settings]\nport = 8080\n";
    let message = parse(&dir.path().join("config.toml"), number).unwrap_err().to_string();
    assert!(
        message.contains("config.toml:6: setting `port` is integer 8080; a setting is a string")
            && message.contains("write a number as \"8080\""),
        "{message}"
    );
    let without_unknown = missing.replace("c = { vault = \"x\" }\n", "");
    let error = parse(&dir.path().join("config.toml"), &without_unknown).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("config.toml:6: setting `a` = { env = \"PULSE_CONFIG_TEST_NO_SUCH_VARIABLE\" }: the variable is not set"),
        "{message}"
    );
    assert!(
        message.contains("config.toml:7: setting `b` = { file = \"nope.txt\" }: cannot read"),
        "{message}"
    );
}

#[test]
fn replicas_to_confirm_on_are_taken_up_to_sixteen() {
    let config = parse(Path::new("c.toml"), "[node]\nconfirm_replicas = 1\n").unwrap();
    assert_eq!(config.node.confirm_replicas, 1);
    assert_eq!(parse(Path::new("c.toml"), "").unwrap().node.confirm_replicas, 2, "the default given");
    let config = parse(Path::new("c.toml"), "[node]\nslot_groups = 16\n").unwrap();
    assert_eq!(config.node.slot_groups, 16);
    for wrong in ["0", "3", "128"] {
        let error = parse(Path::new("c.toml"), &format!("[node]\nslot_groups = {wrong}\n")).unwrap_err();
        assert!(
            error.to_string().contains(&format!(
                "`node.slot_groups` = {wrong} is not allowed: allowed are 1, 2, 4, 8, 16, 32, 64"
            )),
            "{error}"
        );
    }
    let error = parse(Path::new("c.toml"), "[node]\nconfirm_replicas = 17\n").unwrap_err();
    assert!(
        error.to_string().contains("`node.confirm_replicas` = 17 is out of range: allowed are 0 to 16"),
        "{error}"
    );
}

#[test]
fn a_setting_table_is_exactly_one_of_env_or_file_and_anything_else_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
    std::fs::write(dir.path().join("y"), "from-a-file\n").unwrap();
    let forms = "a setting is a string (\"text\"), { env = \"NAME\" } or { file = \"path\" }";
    for (setting, wrong) in [
        ("{ env = \"PATH\", extra = 1 }", "`extra` is not a key of a setting table"),
        ("{ file = \"y\", extra = \"secret-value\" }", "`extra` is not a key of a setting table"),
        ("{ env = \"PATH\", file = \"y\" }", "has both `env` and `file`"),
        ("{ vault = \"x\" }", "`vault` is not a key of a setting table"),
        ("{ env = 1 }", "`env` is integer 1, not a string"),
        ("{}", "is an empty table"),
    ] {
        let text =
            format!("[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\n\n[plugin.settings]\na = {setting}\n");
        let message = parse(&dir.path().join("config.toml"), &text).unwrap_err().to_string();
        assert!(message.contains("config.toml:6: setting `a`"), "{setting}: its line: {message}");
        assert!(message.contains(wrong), "{setting}: what was wrong: {message}");
        assert!(message.contains(forms), "{setting}: the forms allowed: {message}");
        assert!(!message.contains("write a number"), "{setting}: not a number: {message}");
        assert!(!message.contains("secret-value"), "{setting}: values are not shown: {message}");
    }
}

#[test]
fn the_api_certificate_and_key_go_together() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.toml");
    std::fs::write(dir.path().join("api.crt"), "x").unwrap();
    std::fs::write(dir.path().join("api.key"), "x").unwrap();
    let text = "[http]\ntls_cert_file = \"api.crt\"\n";
    let message = parse(&config_path, text).unwrap_err().to_string();
    assert!(
        message.contains("`http.tls_cert_file` and `http.tls_key_file` go together: set both"),
        "{message}"
    );
    let text = "[http]\ntls_cert_file = \"api.crt\"\ntls_key_file = \"api.key\"\n";
    let config = parse(&config_path, text).unwrap();
    let (cert, key) = config.http.unwrap().tls.unwrap();
    assert_eq!((cert, key), (dir.path().join("api.crt"), dir.path().join("api.key")));
}

#[test]
fn a_registry_path_is_pinned_by_digest_unless_tags_are_allowed_and_needs_a_cache() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), b"").unwrap();
    std::fs::write(dir.path().join("signer.pub"), b"").unwrap();
    let path = dir.path().join("config.toml");
    let digest = format!("sha256:{}", "a".repeat(64));
    let text = format!(
        "[runtime]\ncache_dir = \"cache\"\n[[plugin]]\nname = \"p\"\npath = \"oci://ghcr.io/acme/p@{digest}\"\n\
         verify = {{ key = \"signer.pub\" }}\n[[schedule]]\nname = \"s\"\npool = \"p\"\ninterval = \"1s\"\n\
         path = \"oci://ghcr.io/acme/s:v1\"\nallow_tags = true\n"
    );
    let config = parse(&path, &text).unwrap();
    match &config.plugins[0].source {
        crate::Source::Registry { reference, verify } => {
            assert_eq!(reference.digest.as_deref(), Some(digest.as_str()));
            assert_eq!(verify.as_deref(), Some(dir.path().join("signer.pub").as_path()));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(&config.schedules[0].source, crate::Source::Registry { reference, .. } if reference.tag.as_deref() == Some("v1"))
    );

    // A tag alone, no cache folder, a broken reference, and the registry
    // keys on a file path: each named on its line.
    let text = "[[plugin]]\nname = \"a\"\npath = \"oci://ghcr.io/acme/a:v1\"\n\
                [[plugin]]\nname = \"b\"\npath = \"oci://ghcr.io/Acme/b:v1\"\n\
                [[plugin]]\nname = \"c\"\npath = \"p.wasm\"\nallow_tags = true\nverify = { key = \"signer.pub\" }\n";
    let error = parse(&path, text).unwrap_err();
    let message = error.to_string();
    for says in [
        "config.toml:3: plugin \"a\": path names tag \"v1\" without a digest",
        "config.toml:3: plugin \"a\": path is a registry reference; set [runtime] cache_dir",
        "config.toml:6: plugin \"b\": path \"oci://ghcr.io/Acme/b:v1\": repository \"Acme/b\" is not a repository name",
        "config.toml:10: plugin \"c\": allow_tags applies to registry paths",
        "config.toml:11: plugin \"c\": verify checks a signature kept in a registry",
    ] {
        assert!(message.contains(says), "{says}\n{message}");
    }
}

#[test]
fn telemetry_is_off_unless_it_names_a_collector() {
    let path = Path::new("c.toml");
    assert_eq!(parse(path, "").unwrap().telemetry, None);
    let config = parse(path, "[telemetry]\notlp_endpoint = \"http://otel:4318/\"\n").unwrap();
    let telemetry = config.telemetry.unwrap();
    assert_eq!(
        (telemetry.otlp_endpoint.as_str(), telemetry.service_name.as_str(), telemetry.sample_ratio),
        ("http://otel:4318", "pulse-host", 1.0),
        "the trailing / dropped, the defaults filled"
    );
    let text = "[telemetry]\notlp_endpoint = \"otel:4318\"\nservice_name = \"\"\nsample_ratio = 1.5\n";
    let error = parse(path, text).unwrap_err();
    let lines: Vec<_> = error.problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [Some(2), Some(3), Some(4)], "{error}");
    let message = error.to_string();
    assert!(message.contains("is not an OTLP/HTTP address: write http:// or https://"), "{message}");
    assert!(message.contains("`telemetry.service_name` must be 1 to 100 characters"), "{message}");
    assert!(message.contains("from 0.0 (none) to 1.0 (all)"), "{message}");
    let error = parse(path, "[telemetry]\nservice_name = \"x\"\n").unwrap_err();
    assert!(error.to_string().contains("`[telemetry]` needs `otlp_endpoint`"), "{error}");
}
