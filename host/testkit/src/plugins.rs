//! The plugins `scripts/build-plugins` builds, by name.
//!
//! Tests that need a plugin take its path from [`path`]; the plugins are
//! built from source before the tests run (the README's test command does
//! it), never checked in.

use std::path::PathBuf;

/// `echo`: emits the payloads it receives (an example plugin).
pub const ECHO: &str = "echo";
/// `counter`: a timer-driven job that saves its count (an example plugin).
pub const COUNTER: &str = "counter";
/// `counter-v2`: `counter`'s second release; its ticks emit `v2 <count>`.
pub const COUNTER_V2: &str = "counter_v2";
/// `counter-broken`: a bad release of `counter`: it fails the start of
/// every job with saved state, or traps at tick N with the setting
/// `trap-after-ticks = "N"`; its ticks emit `v2 <count>`.
pub const COUNTER_BROKEN: &str = "counter_broken";
/// `fetcher`: polls an HTTP endpoint per job and emits what changed (an
/// example plugin).
pub const FETCHER: &str = "fetcher";
/// `trap`: traps, or returns each kind of error, on demand.
pub const TRAP: &str = "trap";
/// `spin`: loops forever on demand.
pub const SPIN: &str = "spin";
/// `hog`: allocates without bound on demand.
pub const HOG: &str = "hog";
/// `slow`: sleeps for as many milliseconds as its payload says.
pub const SLOW: &str = "slow";
/// `hostile`: misbehaves against each of the host's bounds on demand.
pub const HOSTILE: &str = "hostile";
/// `wrong-world`: a component that does not implement `job-handler`.
pub const WRONG_WORLD: &str = "wrong_world";
/// A job producer keeping one job per entry of its `jobs` setting.
pub const KEEPER: &str = "keeper";
/// `python-echo`: `echo` in Python, counting like `counter` with the
/// setting `interval-ms`, trapping on the notification `trap`.
pub const PYTHON_ECHO: &str = "python_echo";
/// `js-echo`: the same in JavaScript.
pub const JS_ECHO: &str = "js_echo";
/// `python-keeper`: `keeper` in Python.
pub const PYTHON_KEEPER: &str = "python_keeper";

/// Every plugin the build produces.
pub const ALL: &[&str] = &[
    ECHO,
    COUNTER,
    COUNTER_V2,
    COUNTER_BROKEN,
    FETCHER,
    TRAP,
    SPIN,
    HOG,
    SLOW,
    HOSTILE,
    WRONG_WORLD,
    KEEPER,
    PYTHON_ECHO,
    JS_ECHO,
    PYTHON_KEEPER,
];

/// Where the built plugins are: `PULSE_PLUGIN_DIR` when set, otherwise
/// `plugins/target/wasm32-wasip2/release` of this repository.
pub fn dir() -> PathBuf {
    match std::env::var_os("PULSE_PLUGIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/target/wasm32-wasip2/release"),
    }
}

/// The path of the built plugin `name` (one of the constants above).
///
/// # Panics
/// When the plugin is not built, saying how to build it.
pub fn path(name: &str) -> PathBuf {
    let path = dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "plugin {name:?} is not built: {} does not exist (run scripts/build-plugins)",
        path.display()
    );
    path
}
