//! Calls that succeed: the order and content of what handlers do.

use pulse_runtime::{CallError, Isolation, Job, Output};
use pulse_testkit::plugins::{COUNTER, ECHO, TRAP};

use crate::{PATIENCE, load, options, runner, runtime};

#[tokio::test]
async fn echo_round_trip_keeps_payloads_and_order_from_empty_to_one_mib() {
    let runtime = runtime();
    let plugin = load(&runtime, ECHO, options(Isolation::Job, &[("prefix", ">")]));
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

#[tokio::test]
async fn guest_logs_arrive_in_order_inside_the_job_span() {
    let (logs, _guard) = pulse_testkit::logs::capture();
    let runtime = runtime();
    let plugin = load(&runtime, ECHO, options(Isolation::Job, &[]));
    let (runner, _recorder) = runner(&plugin);

    runner.start(Job::new("logged", "x")).await.unwrap();
    runner.stop("logged").await.unwrap();

    let guest: Vec<_> = logs.lines().into_iter().filter(|l| l.target == "pulse_runtime::guest").collect();
    let messages: Vec<_> = guest.iter().map(|l| l.message.as_str()).collect();
    assert_eq!(messages, ["start logged (1 bytes, attempt 1, requeued false)", "stop logged"]);
    for line in &guest {
        assert_eq!(line.field("job.key"), Some("logged"), "{line:?}");
        assert_eq!(line.field("plugin"), Some("echo"), "{line:?}");
    }
}

#[tokio::test]
async fn timers_fire_repeatedly_stop_with_the_job_and_state_resumes() {
    let runtime = runtime();
    let plugin = load(&runtime, COUNTER, options(Isolation::Job, &[("interval-ms", "10")]));
    let (runner, recorder) = runner(&plugin);

    runner.start(Job::new("count", "")).await.unwrap();
    let outputs = recorder.wait_until(PATIENCE, |o| emits(o, "count") >= 3).await;
    assert!(emits(&outputs, "count") >= 3, "the timer did not fire three times: {outputs:?}");
    runner.stop("count").await.unwrap();

    let stopped_at = recorder.emitted("count").len();
    // Nothing can be awaited for "no more ticks": give the timer several
    // intervals to misbehave.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(recorder.emitted("count").len(), stopped_at, "a timer fired after the job stopped");

    // The count saved last comes back with the next start, which resumes it.
    let saved = recorder.saved_state("count").expect("the counter saved its count");
    let resumed_from: u64 = String::from_utf8(saved.clone()).unwrap().parse().unwrap();
    let job = Job { requeued: true, state: Some(saved), ..Job::new("count", "") };
    runner.start(job).await.unwrap();
    let outputs = recorder.wait_until(PATIENCE, |o| emits(o, "count") > stopped_at).await;
    let next = recorder.emitted("count")[stopped_at].clone();
    assert_eq!(String::from_utf8(next).unwrap(), (resumed_from + 1).to_string(), "{outputs:?}");
    runner.stop("count").await.unwrap();
}

#[tokio::test]
async fn a_fenced_job_runs_no_code_and_is_dropped_without_a_stop() {
    let runtime = runtime();
    for isolation in [Isolation::Job, Isolation::Worker] {
        let plugin = load(&runtime, COUNTER, options(isolation, &[("interval-ms", "10")]));
        let (runner, recorder) = runner(&plugin);
        runner.start(Job::new("fenced", "")).await.unwrap();
        runner.start(Job::new("free", "")).await.unwrap();
        recorder.wait_until(PATIENCE, |o| emits(o, "fenced") >= 2).await;

        recorder.fence("fenced");
        let fenced_at = recorder.outputs_of("fenced").len();
        assert_eq!(runner.notify("fenced", b"x".to_vec()).await, Err(CallError::Fenced("fenced".into())));
        // Nothing can be awaited for "no more ticks": the other job's ticks
        // show time passing while the fenced one's timer stays silent.
        let free_before = emits(&recorder.outputs(), "free");
        recorder.wait_until(PATIENCE, |o| emits(o, "free") >= free_before + 5).await;
        runner.abandon("fenced").await;
        assert!(!runner.is_running("fenced"));
        assert!(runner.is_running("free"), "{isolation:?}: abandoning one job left the other running");
        assert_eq!(recorder.outputs_of("fenced").len(), fenced_at, "{isolation:?}: the fenced job ran code");
        runner.stop("free").await.unwrap();
    }
}

#[tokio::test]
async fn a_job_that_completes_is_dropped_and_reported() {
    let runtime = runtime();
    let plugin = load(&runtime, COUNTER, options(Isolation::Job, &[("interval-ms", "5")]));
    let (runner, recorder) = runner(&plugin);

    runner.start(Job::new("short", "3")).await.unwrap();
    let outputs =
        recorder.wait_until(PATIENCE, |o| o.iter().any(|o| matches!(o, Output::Complete { .. }))).await;
    assert_eq!(recorder.emitted("short"), [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()], "{outputs:?}");
    assert!(!runner.is_running("short"), "a completed job must not run any more");
    assert!(matches!(
        runner.notify("short", b"reset".to_vec()).await,
        Err(pulse_runtime::CallError::NotRunning(_))
    ));
}

#[tokio::test]
async fn worker_isolation_serves_many_jobs_from_one_instance() {
    let runtime = runtime();
    let plugin = load(&runtime, COUNTER, options(Isolation::Worker, &[("interval-ms", "5")]));
    let (runner, recorder) = runner(&plugin);

    for key in ["a", "b", "c"] {
        runner.start(Job::new(key, "")).await.unwrap();
    }
    recorder.wait_until(PATIENCE, |o| ["a", "b", "c"].iter().all(|k| emits(o, k) >= 2)).await;
    runner.notify("b", b"reset".to_vec()).await.unwrap();
    runner.stop("a").await.unwrap();
    assert!(runner.is_running("b") && runner.is_running("c") && !runner.is_running("a"));
    // Each job kept its own count: c's emits count up from 1 without gaps.
    let c: Vec<u64> =
        recorder.emitted("c").iter().map(|b| String::from_utf8_lossy(b).parse().unwrap()).collect();
    assert!(c.windows(2).all(|w| w[1] == w[0] + 1), "c's counts: {c:?}");
    runner.close().await;
}

#[tokio::test]
async fn worker_isolation_restarts_the_other_jobs_after_a_trap() {
    let runtime = runtime();
    let plugin = load(&runtime, TRAP, options(Isolation::Worker, &[]));
    let (runner, recorder) = runner(&plugin);
    runner.start(Job::new("victim", "ok")).await.unwrap();
    runner.start(Job::new("bystander", "ok")).await.unwrap();

    let error = runner.notify("victim", b"trap".to_vec()).await.unwrap_err();
    assert!(matches!(error, pulse_runtime::CallError::Trap(_)), "{error:?}");
    assert!(!runner.is_running("victim"));
    // The bystander was started again in a new instance and answers.
    assert!(runner.is_running("bystander"));
    runner.notify("bystander", b"hello".to_vec()).await.unwrap();
    assert!(
        recorder.outputs().iter().all(|o| !matches!(o, Output::Failed { .. })),
        "{:?}",
        recorder.outputs()
    );
}

fn emits(outputs: &[Output], key: &str) -> usize {
    outputs.iter().filter(|o| matches!(o, Output::Emit { key: k, .. } if k == key)).count()
}
