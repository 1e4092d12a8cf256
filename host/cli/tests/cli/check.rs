//! `check` (and `run`) refuse what cannot work, saying exactly what and where.

use pulse_testkit::plugins::{ECHO, FETCHER, WRONG_WORLD};

use crate::{binary, cli, write_config};

fn check(config_text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config_text).unwrap();
    let output =
        std::process::Command::new(binary()).arg("--config").arg(&path).arg("check").output().unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_valid_config_with_real_plugins_checks() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[("echo", ECHO, "workers = 2")], "");
    let (code, out) = cli(&config, None, &["check"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 plugin(s) load"), "{out}");
}

#[test]
fn unknown_keys_and_bad_durations_are_refused_with_their_lines() {
    let (code, err) = check("[node]\nmax_jbos = 3\n");
    assert_eq!(code, 1);
    assert!(err.contains("config.toml:2: unknown field `max_jbos`"), "{err}");

    let (code, err) = check("[node]\nreply_timeout = \"10\"\nretry_backoff = \"1.5s\"\n");
    assert_eq!(code, 1);
    assert!(err.contains("config.toml:2: `node.reply_timeout` = \"10\" is not a duration"), "{err}");
    assert!(err.contains("config.toml:3:"), "every problem at once: {err}");
}

#[test]
fn a_missing_plugin_file_is_refused() {
    let (code, err) = check("[[plugin]]\nname = \"ghost\"\npath = \"ghost.wasm\"\n");
    assert_eq!(code, 1);
    assert!(
        err.contains("config.toml:3: plugin \"ghost\": no file at") && err.contains("ghost.wasm"),
        "{err}"
    );
}

#[test]
fn a_core_module_and_a_component_of_another_world_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("module.wasm");
    // The smallest core module: magic and version 1.
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let text = format!("[[plugin]]\nname = \"core\"\npath = \"{}\"\n", module.display());
    let config = dir.path().join("config.toml");
    std::fs::write(&config, text).unwrap();
    let output =
        std::process::Command::new(binary()).arg("--config").arg(&config).arg("check").output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(err.contains("plugin \"core\" is a core WebAssembly module, not a component"), "{err}");

    let config = write_config(dir.path(), &[("greeter", WRONG_WORLD, "")], "");
    let output =
        std::process::Command::new(binary()).arg("--config").arg(&config).arg("run").output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "run refuses too");
    assert!(err.contains("plugin \"greeter\" does not implement the `pulse:job/job-handler` world"), "{err}");
    assert!(err.contains("pulse:job/handler"), "names what is missing: {err}");
}

#[test]
fn an_allowed_outbound_host_that_is_not_one_is_refused_naming_it_and_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "allowed_outbound_hosts = [\"https://api.example.com\", \"api.example.com:443\"]";
    let config = write_config(dir.path(), &[("fetcher", FETCHER, extra)], "");
    let output =
        std::process::Command::new(binary()).arg("--config").arg(&config).arg("check").output().unwrap();
    let out = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains("plugin \"fetcher\": allowed_outbound_hosts")
            && out.contains("\"api.example.com:443\" has no http:// or https:// scheme")
            && out.contains("allowed are"),
        "{out}"
    );
    let fine = "allowed_outbound_hosts = [\"https://api.example.com\", \"http://127.0.0.1:8080\", \"https://*.example.com:*\"]";
    let config = write_config(dir.path(), &[("fetcher", FETCHER, fine)], "");
    let (code, out) = cli(&config, None, &["check"]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn an_outbound_ca_file_that_holds_no_certificate_or_is_missing_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("not-a-ca.pem"), "hello\n").unwrap();
    let check = |config: &std::path::Path| {
        let output =
            std::process::Command::new(binary()).arg("--config").arg(config).arg("check").output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let extra = "outbound_ca_file = \"not-a-ca.pem\"";
    let config = write_config(dir.path(), &[("fetcher", FETCHER, extra)], "");
    let (code, out) = check(&config);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("plugin \"fetcher\": outbound_ca_file")
            && out.contains("not-a-ca.pem: holds no certificate"),
        "{out}"
    );
    let extra = "outbound_ca_file = \"missing.pem\"";
    let config = write_config(dir.path(), &[("fetcher", FETCHER, extra)], "");
    let (code, out) = check(&config);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("`outbound_ca_file`: no file at") && out.contains("missing.pem"), "{out}");
    let server = pulse_testkit::HttpServer::start_tls();
    let ca = server.ca_file().expect("an HTTPS server").display().to_string();
    let extra = format!("outbound_ca_file = {ca:?}");
    let config = write_config(dir.path(), &[("fetcher", FETCHER, &extra)], "");
    let (code, out) = check(&config);
    assert_eq!(code, Some(0), "{out}");
}
