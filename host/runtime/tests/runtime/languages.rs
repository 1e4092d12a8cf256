//! One contract, each language a plugin may be written in: Rust (`echo`,
//! `counter`, `trap`), Python (`python-echo`, componentize-py) and
//! JavaScript (`js-echo`, componentize-js), held to the same assertions:
//! payloads emitted in order behind the configured prefix, logs in the
//! job's span, timers and a saved state that the next start resumes from,
//! a trap that ends its job only.
//!
//! The Python and JavaScript components carry their interpreter (18 and
//! 12 MB): they are compiled once into a cache shared by these tests.

use pulse_runtime::{CallError, Isolation, Job, Runtime, RuntimeConfig};
use pulse_testkit::plugins::{COUNTER, ECHO, JS_ECHO, PYTHON_ECHO, TRAP};

use crate::{PATIENCE, load, options, runner};

/// The plugins that play each part of the contract in one language.
struct Language {
    /// Emits its start's payload and each notification's, behind the
    /// `prefix` setting.
    echo: &'static str,
    /// With the setting `interval-ms`: counts on a repeating `tick` timer,
    /// saving and emitting each count; resumes from the saved count.
    counter: &'static str,
    /// Traps on the notification `trap`.
    trap: &'static str,
}

const RUST: Language = Language { echo: ECHO, counter: COUNTER, trap: TRAP };
const PYTHON: Language = Language { echo: PYTHON_ECHO, counter: PYTHON_ECHO, trap: PYTHON_ECHO };
const JAVASCRIPT: Language = Language { echo: JS_ECHO, counter: JS_ECHO, trap: JS_ECHO };

/// A runtime whose compiled plugins are cached for every test of this
/// binary (an interpreter takes seconds to compile).
fn runtime() -> Runtime {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache");
    Runtime::new(RuntimeConfig::default().cache_dir(cache)).expect("the configuration builds")
}

async fn emits_each_payload_in_order_behind_the_prefix(language: &Language) {
    let runtime = runtime();
    let plugin = load(&runtime, language.echo, options(Isolation::Job, &[("prefix", ">")]));
    let (runner, recorder) = runner(&plugin);
    for size in [0usize, 1, 16, 64 * 1024, 1 << 20] {
        let key = format!("echo-{size}");
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        runner.start(Job::new(&key, payload.clone())).await.unwrap();
        runner.notify(&key, b"first".to_vec()).await.unwrap();
        runner.notify(&key, payload.clone()).await.unwrap();
        runner.stop(&key).await.unwrap();
        assert!(!runner.is_running(&key));

        let with_prefix = |bytes: &[u8]| [b">".as_slice(), bytes].concat();
        assert_eq!(
            recorder.emitted(&key),
            vec![with_prefix(&payload), with_prefix(b"first"), with_prefix(&payload)],
            "emits of {key}"
        );
    }
}

async fn logs_arrive_in_order_inside_the_job_span(language: &Language) {
    let (logs, _guard) = pulse_testkit::logs::capture();
    let runtime = runtime();
    let plugin = load(&runtime, language.echo, options(Isolation::Job, &[]));
    let (runner, _recorder) = runner(&plugin);

    runner.start(Job::new("logged", "x")).await.unwrap();
    runner.stop("logged").await.unwrap();

    let guest: Vec<_> = logs.lines().into_iter().filter(|l| l.target == "pulse_runtime::guest").collect();
    let messages: Vec<_> = guest.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(messages, ["start logged (1 bytes, attempt 1, requeued false)", "stop logged"]);
    for line in &guest {
        assert_eq!(line.field("job.key"), Some("logged"), "{line:?}");
        assert_eq!(line.field("plugin"), Some(language.echo), "{line:?}");
    }
}

async fn timers_fire_repeatedly_stop_with_the_job_and_state_resumes(language: &Language) {
    let runtime = runtime();
    let plugin = load(&runtime, language.counter, options(Isolation::Job, &[("interval-ms", "10")]));
    let (runner, recorder) = runner(&plugin);
    let emits = |recorder: &pulse_runtime::Recorder| recorder.emitted("count").len();

    runner.start(Job::new("count", "")).await.unwrap();
    recorder.wait_until(PATIENCE, |outputs| emitted(outputs) >= 3).await;
    assert!(emits(&recorder) >= 3, "the timer did not fire three times: {:?}", recorder.outputs());
    runner.stop("count").await.unwrap();

    let stopped_at = emits(&recorder);
    // Nothing can be awaited for "no more ticks": give the timer several
    // intervals to misbehave.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(emits(&recorder), stopped_at, "a timer fired after the job stopped");
    let counts: Vec<String> =
        recorder.emitted("count").into_iter().map(|c| String::from_utf8(c).unwrap()).collect();
    let expected: Vec<String> = (1..=stopped_at).map(|n| n.to_string()).collect();
    assert_eq!(counts, expected, "each tick emits the next count");

    // The count saved last comes back with the next start, which resumes it.
    let saved = recorder.saved_state("count").expect("the counter saved its count");
    assert_eq!(saved, stopped_at.to_string().into_bytes(), "the last count was saved");
    let job = Job { requeued: true, state: Some(saved), ..Job::new("count", "") };
    runner.start(job).await.unwrap();
    recorder.wait_until(PATIENCE, |outputs| emitted(outputs) > stopped_at).await;
    let next = recorder.emitted("count")[stopped_at].clone();
    assert_eq!(String::from_utf8(next).unwrap(), (stopped_at + 1).to_string());
    runner.stop("count").await.unwrap();
}

/// How many events job `count` emitted in `outputs`.
fn emitted(outputs: &[pulse_runtime::Output]) -> usize {
    outputs.iter().filter(|o| matches!(o, pulse_runtime::Output::Emit { key, .. } if key == "count")).count()
}

async fn a_trap_ends_its_job_only(language: &Language) {
    let runtime = runtime();
    let plugin = load(&runtime, language.trap, options(Isolation::Job, &[]));
    let (runner, _) = runner(&plugin);
    runner.start(Job::new("neighbour", "ok")).await.unwrap();
    runner.start(Job::new("doomed", "ok")).await.unwrap();

    let error = runner.notify("doomed", b"trap".to_vec()).await.unwrap_err();
    assert!(matches!(error, CallError::Trap(_)), "{error:?}");
    assert!(!runner.is_running("doomed"), "the job that trapped still runs");
    runner.notify("neighbour", b"ok".to_vec()).await.unwrap();
    assert!(runner.is_running("neighbour"));
    runner.stop("neighbour").await.unwrap();
}

macro_rules! contract {
    ($module:ident, $language:ident) => {
        mod $module {
            #[tokio::test]
            async fn emits_each_payload_in_order_behind_the_prefix() {
                super::emits_each_payload_in_order_behind_the_prefix(&super::$language).await;
            }

            #[tokio::test]
            async fn logs_arrive_in_order_inside_the_job_span() {
                super::logs_arrive_in_order_inside_the_job_span(&super::$language).await;
            }

            #[tokio::test]
            async fn timers_fire_repeatedly_stop_with_the_job_and_state_resumes() {
                super::timers_fire_repeatedly_stop_with_the_job_and_state_resumes(&super::$language).await;
            }

            #[tokio::test]
            async fn a_trap_ends_its_job_only() {
                super::a_trap_ends_its_job_only(&super::$language).await;
            }
        }
    };
}

contract!(rust, RUST);
contract!(python, PYTHON);
contract!(javascript, JAVASCRIPT);
