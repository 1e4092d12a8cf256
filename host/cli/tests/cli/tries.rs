//! `pulse-host try`: a component run in-process as a script says, on a
//! clock the script advances. Judged from what the plugin itself did: its
//! emits and saved states as printed, in order.

use std::process::Command;

use pulse_testkit::plugins::{COUNTER, TRAP, path};

/// Runs `try` with `args` then the script `text`: exit code, stdout.
fn try_script(plugin: &str, args: &[&str], text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.txt");
    std::fs::write(&script, text).unwrap();
    let output = Command::new(crate::binary())
        .arg("try")
        .args(args)
        .arg(path(plugin))
        .arg(&script)
        .env_remove("PULSE_REDIS_URL")
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// The printed lines of one kind (`emit c1`), their values in order.
fn values(out: &str, prefix: &str) -> Vec<String> {
    out.lines().filter_map(|line| line.strip_prefix(prefix)).map(str::to_owned).collect()
}

#[test]
fn a_counter_ticks_on_the_scripts_clock_and_resumes_from_its_saved_state_after_a_move() {
    let script = "# every second\nstart c1\nadvance 3s\ncrash-and-move c1\nadvance 2s\nstop c1\n";
    let (code, out, err) = try_script(COUNTER, &[], script);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(values(&out, "emit c1: "), ["1", "2", "3", "4", "5"], "{out}");
    assert_eq!(values(&out, "state c1: "), ["1", "2", "3", "4", "5"], "{out}");
    assert_eq!(out.lines().filter(|line| *line == "ok").count(), 5, "every step went well: {out}");
    assert!(err.contains("start c1 at 3"), "the move restarted it from its state: {err}");
    // A moved job keeps its payload: counting to 4, it completes there.
    let script = "start c2 4\nadvance 2s\ncrash-and-move c2\nadvance 3s\n";
    let (code, out, err) = try_script(COUNTER, &[], script);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(values(&out, "emit c2: "), ["1", "2", "3", "4"], "{out}");
    assert!(out.contains("complete c2"), "the target came with the move: {out}");
    // A setting, as in [plugin.settings]: twice as many ticks.
    let (code, out, _) = try_script(COUNTER, &["--settings", "interval-ms=500"], "start c1\nadvance 2s\n");
    assert_eq!(code, 0);
    assert_eq!(values(&out, "emit c1: "), ["1", "2", "3", "4"], "{out}");
}

#[test]
fn a_trap_is_printed_with_its_line_and_the_exit_code_says_so() {
    let (code, out, _) = try_script(TRAP, &[], "start t1 trap\nstart t2 fine\n");
    assert_eq!(code, 5, "{out}");
    assert!(out.contains("error (line 1): the plugin trapped"), "{out}");
    assert!(out.ends_with("> start t2 fine\nok\n"), "the script goes on: {out}");
}

#[test]
fn a_wrong_script_or_setting_is_refused_naming_it_and_nothing_runs() {
    let (code, out, err) = try_script(COUNTER, &[], "start c1\njump c1\n");
    assert_eq!(code, 1);
    assert!(out.is_empty(), "nothing ran: {out}");
    assert!(err.contains("line 2: unknown step \"jump\": allowed are start KEY"), "{err}");
    let (code, _, err) = try_script(COUNTER, &["--settings", "interval-ms"], "start c1\n");
    assert_eq!(code, 1);
    assert!(err.contains("--settings \"interval-ms\": write KEY=VALUE"), "{err}");
}
