//! Handlers that fail: each failure is typed, ends one job, and leaves the
//! runtime able to run others.

use std::time::Duration;

use pulse_runtime::{CallError, Isolation, Job, JobError, JobRunner, Limits, PluginOptions};
use pulse_testkit::plugins::{ECHO, HOG, HOSTILE, SLOW, SPIN, TRAP};

use crate::{load, options, runner, runtime};

/// After a failure, the same runtime still runs echo jobs.
async fn echo_still_runs(runtime: &pulse_runtime::Runtime) {
    let plugin = load(runtime, ECHO, options(Isolation::Job, &[]));
    let (runner, recorder) = runner(&plugin);
    runner.start(Job::new("after", "fine")).await.unwrap();
    runner.notify("after", b"still".to_vec()).await.unwrap();
    runner.stop("after").await.unwrap();
    assert_eq!(recorder.emitted("after"), [b"fine".to_vec(), b"still".to_vec()]);
}

/// Starts `key` normally, then sends `payload` and returns the error.
async fn fail_notify(runner: &JobRunner, key: &str, payload: &[u8]) -> CallError {
    runner.start(Job::new(key, "ok")).await.unwrap();
    let error = runner.notify(key, payload.to_vec()).await.unwrap_err();
    assert!(error.ends_job(), "{error:?} must end the job");
    assert!(!runner.is_running(key), "{key} still runs after {error:?}");
    error
}

#[tokio::test]
async fn a_trap_fails_the_call_with_its_message_and_ends_only_its_job() {
    let (logs, _guard) = pulse_testkit::logs::capture();
    let runtime = runtime();
    let plugin = load(&runtime, TRAP, options(Isolation::Job, &[]));
    let (runner, _) = runner(&plugin);
    runner.start(Job::new("neighbour", "ok")).await.unwrap();

    let error = runner.start(Job::new("at-start", "trap")).await.unwrap_err();
    assert!(matches!(&error, CallError::Trap(m) if m.contains("unreachable")), "{error:?}");
    assert!(!runner.is_running("at-start"));

    let error = fail_notify(&runner, "later", b"trap").await;
    assert!(matches!(error, CallError::Trap(_)), "{error:?}");

    // The guest's panic message went to its stderr, which is the job's log.
    let panics = logs.containing("trap requested");
    assert!(!panics.is_empty(), "the panic message was not logged");
    assert_eq!(panics[0].field("stream"), Some("stderr"));
    assert_eq!(panics[0].field("job.key"), Some("at-start"));

    runner.notify("neighbour", b"ok".to_vec()).await.unwrap();
    echo_still_runs(&runtime).await;
}

#[tokio::test]
async fn guest_errors_keep_their_kind_and_message() {
    let runtime = runtime();
    let plugin = load(&runtime, TRAP, options(Isolation::Job, &[]));
    let (runner, _) = runner(&plugin);

    for (payload, expected) in [
        ("invalid", JobError::InvalidInput("invalid input requested".into())),
        ("retry", JobError::Retryable("retry requested".into())),
        ("fail", JobError::Fatal("failure requested".into())),
    ] {
        let error = runner.start(Job::new(payload, payload)).await.unwrap_err();
        assert_eq!(error, CallError::Guest(expected.clone()));
        assert!(!runner.is_running(payload), "a refused start leaves no job");
    }

    // During notify, only `fatal` ends the job.
    runner.start(Job::new("steady", "ok")).await.unwrap();
    for payload in ["invalid", "retry"] {
        let error = runner.notify("steady", payload.as_bytes().to_vec()).await.unwrap_err();
        assert!(!error.ends_job(), "{error:?}");
        assert!(runner.is_running("steady"));
    }
    let error = runner.notify("steady", b"fail".to_vec()).await.unwrap_err();
    assert_eq!(error, CallError::Guest(JobError::Fatal("failure requested".into())));
    assert!(!runner.is_running("steady"));
}

#[tokio::test]
async fn an_endless_loop_is_stopped_by_the_call_deadline() {
    let runtime = runtime();
    let timeout = Duration::from_millis(200);
    let spin_options = PluginOptions {
        limits: Limits { call_timeout: timeout, ..Limits::default() },
        ..PluginOptions::default()
    };
    let plugin = load(&runtime, SPIN, spin_options);
    let (runner, _) = runner(&plugin);

    let error = runner.start(Job::new("spinning", "spin")).await.unwrap_err();
    assert_eq!(error, CallError::Timeout(timeout));
    let error = fail_notify(&runner, "spins-later", b"spin").await;
    assert_eq!(error, CallError::Timeout(timeout));
    echo_still_runs(&runtime).await;
}

#[tokio::test]
async fn a_slow_call_times_out_without_blocking_other_instances() {
    let runtime = runtime();
    let timeout = Duration::from_millis(300);
    let slow_options = PluginOptions {
        limits: Limits { call_timeout: timeout, ..Limits::default() },
        ..PluginOptions::default()
    };
    let plugin = load(&runtime, SLOW, slow_options);
    let (runner, _) = runner(&plugin);

    runner.start(Job::new("quick", "1")).await.unwrap();
    let sleeper = runner.start(Job::new("sleeper", "60000"));
    let other = async {
        // While the sleeper sleeps, another instance answers.
        runner.start(Job::new("other", "0")).await.unwrap();
        runner.notify("other", b"5".to_vec()).await.unwrap();
    };
    let (error, ()) = tokio::join!(sleeper, other);
    assert_eq!(error.unwrap_err(), CallError::Timeout(timeout));
    assert!(runner.is_running("quick") && runner.is_running("other"));
}

#[tokio::test]
async fn unbounded_allocation_hits_the_memory_limit() {
    let runtime = runtime();
    let limit = 16 << 20;
    let hog_options =
        PluginOptions { limits: Limits { memory: limit, ..Limits::default() }, ..PluginOptions::default() };
    let plugin = load(&runtime, HOG, hog_options);
    let (runner, _) = runner(&plugin);

    let error = runner.start(Job::new("hungry", "hog")).await.unwrap_err();
    assert_eq!(error, CallError::MemoryLimit { limit });
    let error = fail_notify(&runner, "hungry-later", b"hog").await;
    assert_eq!(error, CallError::MemoryLimit { limit });
    echo_still_runs(&runtime).await;
}

#[tokio::test]
async fn fuel_bounds_a_call_when_enabled() {
    let runtime = pulse_runtime::Runtime::new(pulse_runtime::RuntimeConfig::default().fuel(true)).unwrap();
    let fuel = 5_000_000;
    let spin_options = PluginOptions {
        limits: Limits { fuel: Some(fuel), ..Limits::default() },
        ..PluginOptions::default()
    };
    let plugin = load(&runtime, SPIN, spin_options);
    let (runner, _) = runner(&plugin);

    runner.start(Job::new("fuelled", "ok")).await.unwrap();
    let error = runner.notify("fuelled", b"spin".to_vec()).await.unwrap_err();
    assert_eq!(error, CallError::FuelExhausted(fuel));
}

/// A `stop` looping in the guest whose caller stops waiting (its host
/// gave up after `shutdown_timeout`) is cut off at once, not left to run
/// until `call_timeout`: the other job of its instance (worker isolation)
/// is answered again at once, started afresh in a new instance.
#[tokio::test]
async fn a_call_whose_caller_stopped_waiting_is_cut_off_at_once() {
    let runtime = runtime();
    let mut looping = options(Isolation::Worker, &[("stop", "loop")]);
    looping.limits.call_timeout = Duration::from_secs(600);
    let plugin = load(&runtime, HOSTILE, looping);
    let (runner, _) = runner(&plugin);
    runner.start(Job::new("looping", "")).await.unwrap();
    runner.start(Job::new("other", "")).await.unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), runner.stop("looping")).await;
    assert!(gave_up.is_err(), "stop loops");
    // Behind the looping call in the same instance: answered only once
    // that call was cut.
    let answered = tokio::time::timeout(Duration::from_secs(30), runner.notify("other", b"".to_vec())).await;
    assert_eq!(answered.expect("answered long before call_timeout"), Ok(()));
    assert!(runner.is_running("other"));
    assert!(!runner.is_running("looping"));
}

/// A call may not outlive the lease it started under: once its job is
/// lost (its worker's lease may have ended), a call still running for it
/// is cut off at once, not at `call_timeout`; the other job of its
/// instance, lost too, is not started again.
#[tokio::test]
async fn a_call_running_when_its_job_is_lost_is_cut_off_at_once() {
    let (logs, _guard) = pulse_testkit::logs::capture();
    let runtime = runtime();
    let mut patient = options(Isolation::Worker, &[]);
    patient.limits.call_timeout = Duration::from_secs(600);
    let plugin = load(&runtime, SLOW, patient);
    let (runner, recorder) = runner(&plugin);
    runner.start(Job::new("busy", "")).await.unwrap();
    runner.start(Job::new("beside", "")).await.unwrap();
    let mut call = Box::pin(runner.notify("busy", b"600000".to_vec()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while logs.containing("sleeping 600000 ms").is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the call never ran");
        assert!(tokio::time::timeout(Duration::from_millis(10), &mut call).await.is_err(), "it sleeps");
    }
    recorder.lose("busy");
    recorder.lose("beside");
    let answer = tokio::time::timeout(Duration::from_secs(30), call).await;
    assert_eq!(answer.expect("cut off long before call_timeout"), Err(CallError::Lost("busy".into())));
    assert!(!runner.is_running("busy"));
    assert!(!runner.is_running("beside"), "the lost neighbour is not started again");
}
