//! Plugins from an OCI registry: pushed, signed, pulled by digest into the
//! cache and run; and each way a pull can fail, named, with nothing left in
//! the cache. Against a real registry (`docker-registry`) on loopback.

use std::path::{Path, PathBuf};
use std::process::Command;

use pulse_testkit::plugins::{ECHO, WRONG_WORLD};
use pulse_testkit::{RedisServer, Registry, registry};

use crate::{Host, binary, cli, eventually, wait_for_workers};

/// Runs `pulse-host ARGS` in `dir` with `env`; exit code, stdout, stderr.
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(binary())
        .current_dir(dir)
        .args(args)
        .env_remove("PULSE_REGISTRY_USERNAME")
        .env_remove("PULSE_REGISTRY_PASSWORD")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// Pushes plugin `plugin` to `to`; returns the reference `push` prints for
/// a plugin's `path` (pinned to the manifest's digest).
fn push(dir: &Path, plugin: &str, to: &str, env: &[(&str, &str)]) -> String {
    let file = pulse_testkit::plugins::path(plugin);
    let (code, out, err) = run(dir, &["push", file.to_str().unwrap(), to], env);
    assert_eq!(code, 0, "push {plugin} to {to}: {out}{err}");
    let line = out.lines().find_map(|line| line.trim().strip_prefix("path = ")).expect(&out);
    let reference = line.trim_matches('"').to_owned();
    assert!(reference.contains("@sha256:"), "{out}");
    reference
}

/// A config.toml in `dir` with one plugin at `path` and `extra` lines in
/// its table, its pulled components kept in `dir/cache`.
fn config(dir: &Path, path: &str, extra: &str) -> PathBuf {
    let file = dir.join("config.toml");
    let text = format!(
        "[runtime]\ncache_dir = \"cache\"\n\n[[plugin]]\nname = \"echo\"\npath = \"{path}\"\n{extra}\n[plugin.settings]\nprefix = \"> \"\n"
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// The files under `dir/cache/oci`.
fn cached(dir: &Path) -> Vec<PathBuf> {
    fn walk(path: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                walk(&entry.path(), found);
            } else {
                found.push(entry.path());
            }
        }
    }
    let mut found = Vec::new();
    walk(&dir.join("cache").join("oci"), &mut found);
    found
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest as _;
    let bytes = std::fs::read(path).unwrap();
    let hex: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[test]
fn a_plugin_pushed_signed_and_pinned_by_digest_is_pulled_verified_and_runs_its_jobs() {
    let registry = Registry::start();
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (code, out, err) = run(dir, &["keygen", "signer"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let reference = push(dir, ECHO, &registry.reference("plugins/echo:v1"), &[]);
    let (code, out, err) = run(dir, &["sign", &reference, "--key", "signer.key"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let config = config(dir, &reference, "verify = { key = \"signer.pub\" }");

    let host = Host::start(&config, redis);
    wait_for_workers(&config, redis, "echo", 1);
    assert_eq!(
        cli(&config, redis, &["dispatch", "--pool", "echo", "k", "--payload", "from a registry"]).0,
        0
    );
    eventually("the pulled plugin's job emits", || {
        cli(&config, redis, &["events", "--pool", "echo"]).1.contains("k: > from a registry")
    });
    // The pool records the component's own digest: the same release as
    // the file it was pushed from.
    let (code, workers) = cli(&config, redis, &["workers", "--pool", "echo", "--json"]);
    assert_eq!(code, 0);
    let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
    let file_digest = sha256_of(&pulse_testkit::plugins::path(ECHO));
    assert_eq!(workers[0]["digest"], file_digest.as_str(), "{workers}");
    drop(host);

    // The cache holds the manifest and the component by digest, and what
    // the key verified: with the registry gone, the host still loads it.
    let files = cached(dir);
    let manifest_hex = reference.rsplit_once("sha256:").unwrap().1;
    assert!(files.iter().any(|f| f.ends_with(manifest_hex)), "{files:?}");
    assert!(files.iter().any(|f| f.ends_with(file_digest.strip_prefix("sha256:").unwrap())), "{files:?}");
    drop(registry);
    let (code, out, err) = run(dir, &["--config", "config.toml", "check"], &[]);
    assert_eq!(code, 0, "a cached, verified component needs no registry: {out}{err}");

    // A damaged cache file is noticed and, the registry being gone, the
    // pull fails with the reason instead of loading it.
    let component = files.iter().find(|f| f.ends_with(file_digest.strip_prefix("sha256:").unwrap())).unwrap();
    std::fs::write(component, b"not the component").unwrap();
    let (code, _, err) = run(dir, &["--config", "config.toml", "check"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not match its digest") && err.contains("cannot reach registry"), "{err}");
}

#[test]
fn each_way_a_pull_fails_is_named_and_leaves_nothing_in_the_cache() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    for name in ["signer", "other"] {
        assert_eq!(run(dir, &["keygen", name], &[]).0, 0);
    }
    let unsigned = push(dir, ECHO, &registry.reference("echo:unsigned"), &[]);
    let signed = push(dir, ECHO, &registry.reference("echo-signed:v1"), &[]);
    assert_eq!(run(dir, &["sign", &signed, "--key", "signer.key"], &[]).0, 0);
    let wrong_world = push(dir, WRONG_WORLD, &registry.reference("greeter:v1"), &[]);
    let missing = format!("{}@sha256:{}", registry.reference("echo"), "0".repeat(64));
    let closed = format!("oci://127.0.0.1:1/echo@sha256:{}", "1".repeat(64));

    let check = |path: &str, extra: &str| {
        let _ = std::fs::remove_dir_all(dir.join("cache"));
        config(dir, path, extra);
        let (code, out, err) = run(dir, &["--config", "config.toml", "check"], &[]);
        assert_ne!(code, 0, "{path} {extra}: {out}");
        err
    };
    let check_pull = |path: &str, extra: &str| {
        let err = check(path, extra);
        assert!(cached(dir).is_empty(), "a failed pull of {path} left {:?}", cached(dir));
        err
    };
    let err = check_pull(&unsigned, "verify = { key = \"signer.pub\" }");
    assert!(err.contains("is not signed") && err.contains("signer.pub"), "{err}");
    let err = check_pull(&signed, "verify = { key = \"other.pub\" }");
    assert!(err.contains("none of its 1 signature(s) is by the key") && err.contains("other.pub"), "{err}");
    let err = check_pull(&missing, "");
    assert!(err.contains("the registry has no such manifest (404"), "{err}");
    let err = check_pull(&closed, "");
    assert!(err.contains("cannot reach registry 127.0.0.1:1"), "{err}");
    let err = check(&registry.reference("echo:unsigned"), "");
    assert!(
        err.contains("names tag \"unsigned\" without a digest") && err.contains("allow_tags = true"),
        "{err}"
    );
    // Pulled whole, but not a job handler: refused by the loader.
    let err = check(&wrong_world, "");
    assert!(err.contains("does not implement the `pulse:job/job-handler` world"), "{err}");
    let err = check(&signed, "verify = { key = \"absent.pub\" }");
    assert!(err.contains("verify.key") && err.contains("absent.pub"), "{err}");

    // A tag is taken where allowed, resolved by the registry each time.
    config(dir, &registry.reference("echo:unsigned"), "allow_tags = true");
    let (code, out, err) = run(dir, &["--config", "config.toml", "check"], &[]);
    assert_eq!(code, 0, "{out}{err}");

    // A push without a tag is reachable by its digest alone.
    let bare = push(dir, ECHO, &registry.reference("bare"), &[]);
    config(dir, &bare, "");
    assert_eq!(run(dir, &["--config", "config.toml", "check"], &[]).0, 0, "{bare}");

    // What push refuses: a file that is not a component, a digest as
    // its destination.
    std::fs::write(dir.join("module.wasm"), wat::parse_str("(module)").unwrap()).unwrap();
    let (code, _, err) = run(dir, &["push", "module.wasm", &registry.reference("m:v1")], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("not a WebAssembly component (a core module)"), "{err}");
    let (code, _, err) = run(dir, &["push", "module.wasm", &signed], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("the digest is the registry's answer"), "{err}");
}

#[test]
fn a_registry_that_asks_for_credentials_gets_them_from_the_environment_or_a_clear_refusal() {
    let registry = Registry::start_with_auth();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let file = pulse_testkit::plugins::path(ECHO);
    let to = registry.reference("echo:v1");
    let (code, _, err) = run(dir, &["push", file.to_str().unwrap(), &to], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("401 Unauthorized") && err.contains("set PULSE_REGISTRY_USERNAME"), "{err}");
    let wrong = [("PULSE_REGISTRY_USERNAME", registry::USER), ("PULSE_REGISTRY_PASSWORD", "wrong")];
    let (code, _, err) = run(dir, &["push", file.to_str().unwrap(), &to], &wrong);
    assert_eq!(code, 1);
    assert!(err.contains("refused the credentials"), "{err}");

    let right =
        [("PULSE_REGISTRY_USERNAME", registry::USER), ("PULSE_REGISTRY_PASSWORD", registry::PASSWORD)];
    let reference = push(dir, ECHO, &to, &right);
    config(dir, &reference, "");
    let (code, _, err) = run(dir, &["--config", "config.toml", "check"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("401 Unauthorized"), "{err}");
    assert!(cached(dir).is_empty(), "{:?}", cached(dir));
    let (code, out, err) = run(dir, &["--config", "config.toml", "check"], &right);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn a_rollout_announces_a_registry_reference_and_takes_only_a_release_signed_for_the_plugin() {
    use pulse_testkit::plugins::{COUNTER, COUNTER_V2};
    let registry = Registry::start();
    let server = RedisServer::start();
    let redis = Some(server.url());
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    assert_eq!(run(dir, &["keygen", "signer"], &[]).0, 0);
    let v1 = push(dir, COUNTER, &registry.reference("counter:v1"), &[]);
    assert_eq!(run(dir, &["sign", &v1, "--key", "signer.key"], &[]).0, 0);
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\ncache_dir = \"cache\"\n\n[[plugin]]\nname = \"count\"\npath = \"{v1}\"\n\
             verify = {{ key = \"signer.pub\" }}\nisolation = \"worker\"\nupgrade_window = \"0s\"\n"
        ),
    )
    .unwrap();
    let _host = Host::start(&config, redis);
    wait_for_workers(&config, redis, "count", 1);
    let digests = || {
        let (code, out) = cli(&config, redis, &["workers", "--pool", "count", "--json"]);
        assert_eq!(code, 0, "{out}");
        let workers: serde_json::Value = serde_json::from_str(&out).unwrap();
        workers
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["digest"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(digests(), [sha256_of(&pulse_testkit::plugins::path(COUNTER))]);

    // Not signed: the announcing client pulls it with the plugin's key
    // and refuses it; nothing is announced.
    push(dir, COUNTER_V2, &registry.reference("counter:v2"), &[]);
    let start = ["rollout", "start", "--pool", "count", "--file", &registry.reference("counter:v2")];
    let (code, out, err) = crate::cli_all(&config, server.url(), &start);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("is not signed"), "{err}");

    // Signed: announced by tag, pinned by the client, taken by the host.
    let v2 = format!("{}:v2", registry.reference("counter"));
    assert_eq!(run(dir, &["sign", &v2, "--key", "signer.key"], &[]).0, 0);
    let (code, out, err) = crate::cli_all(&config, server.url(), &start);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("@sha256:"), "the reference announced is pinned: {out}");
    let v2_digest = sha256_of(&pulse_testkit::plugins::path(COUNTER_V2));
    eventually("the worker runs the announced release from the registry", || {
        digests() == [v2_digest.clone()]
    });
}
