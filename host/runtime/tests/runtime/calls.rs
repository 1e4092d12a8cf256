//! Calls that succeed: the order and content of what handlers do (the
//! contract every language's plugins meet is in `languages`).

use pulse_runtime::{CallError, Isolation, Job, Output, Recorder, Runtime, RuntimeConfig};
use pulse_testkit::plugins::{COUNTER, HOSTILE, TRAP};

use crate::{PATIENCE, load, options, runner, runtime};

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

#[tokio::test]
async fn an_instance_sees_nothing_an_earlier_instance_left_in_its_memory() {
    // One slot: every instance of the test reuses the same memory.
    let runtime = Runtime::new(RuntimeConfig::default().max_instances(1)).unwrap();
    let remembered = |recorder: &Recorder, key: &str| recorder.emitted(key).concat();

    // Worker isolation, one instance: what `remember` kept, `recall` finds
    // (on the heap and in static memory), so the probe can see it.
    let plugin = load(&runtime, HOSTILE, options(Isolation::Worker, &[]));
    let (shared, recorder) = runner(&plugin);
    shared.start(Job::new("secret", "remember")).await.unwrap();
    shared.start(Job::new("probe", "recall")).await.unwrap();
    assert_eq!(remembered(&recorder, "probe"), b"secretsecret");
    shared.close().await;

    // Job isolation: the next instance in the slot starts from the
    // module's own memory, however the slot was reset.
    let plugin = load(&runtime, HOSTILE, options(Isolation::Job, &[]));
    let (runner, recorder) = runner(&plugin);
    for round in 0..3 {
        let secret = format!("secret-{round}");
        runner.start(Job::new(&secret, "remember")).await.unwrap();
        runner.stop(&secret).await.unwrap();
        let probe = format!("probe-{round}");
        runner.start(Job::new(&probe, "recall")).await.unwrap();
        assert_eq!(remembered(&recorder, &probe), b"", "round {round}");
        runner.stop(&probe).await.unwrap();
    }
    runner.close().await;
}

/// The state a job saved last is what its runner tells (what a host
/// writes back when Redis lost it): the one it started with, then each
/// save; none for a job that does not run here.
#[tokio::test]
async fn a_runner_tells_the_state_each_job_saved_last() {
    let runtime = runtime();
    let plugin = load(&runtime, COUNTER, options(Isolation::Worker, &[("interval-ms", "3600000")]));
    let (runner, recorder) = runner(&plugin);
    runner.start(Job { state: Some(b"7".to_vec()), ..Job::new("resumed", "") }).await.unwrap();
    runner.start(Job::new("fresh", "")).await.unwrap();
    assert_eq!(runner.saved_state("resumed").await, Some(b"7".to_vec()));
    assert_eq!(runner.saved_state("fresh").await, None);
    runner.notify("resumed", b"reset".to_vec()).await.unwrap();
    assert_eq!(recorder.saved_state("resumed"), Some(b"0".to_vec()));
    assert_eq!(runner.saved_state("resumed").await, Some(b"0".to_vec()));
    assert_eq!(runner.saved_state("elsewhere").await, None);
}

/// A [`Recorder`] that also notes, for each write of a job, whether a call
/// scope of that job was open ([`pulse_runtime::JobOutputs::call_scope`]).
#[derive(Clone, Default)]
struct Scoped {
    recorder: Recorder,
    open: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// (key, what, whether in a scope), in order.
    writes: std::sync::Arc<std::sync::Mutex<Vec<Noted>>>,
}

/// A write of a job: its key, what it was, whether its call's scope was open.
type Noted = (String, &'static str, bool);

/// Ends a scope of [`Scoped`] when dropped.
struct ScopeOf(Scoped, String);

impl Drop for ScopeOf {
    fn drop(&mut self) {
        *self.0.open.lock().unwrap().get_mut(&self.1).unwrap() -= 1;
    }
}

impl Scoped {
    fn note(&self, key: &str, what: &'static str) {
        let open = self.open.lock().unwrap().get(key).is_some_and(|n| *n > 0);
        self.writes.lock().unwrap().push((key.to_owned(), what, open));
    }
}

impl pulse_runtime::JobOutputs for Scoped {
    fn emit<'a>(
        &'a self,
        key: &'a str,
        payload: Vec<u8>,
    ) -> pulse_runtime::BoxFuture<'a, Result<(), pulse_runtime::HostRefusal>> {
        self.note(key, "emit");
        self.recorder.emit(key, payload)
    }

    fn save_state<'a>(
        &'a self,
        key: &'a str,
        state: Vec<u8>,
    ) -> pulse_runtime::BoxFuture<'a, Result<(), pulse_runtime::HostRefusal>> {
        self.note(key, "save-state");
        self.recorder.save_state(key, state)
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
    ) -> pulse_runtime::BoxFuture<'a, Result<(), pulse_runtime::HostRefusal>> {
        self.note(key, "complete");
        self.recorder.complete(key)
    }

    fn job_failed<'a>(&'a self, key: &'a str, error: &'a CallError) -> pulse_runtime::BoxFuture<'a, ()> {
        self.recorder.job_failed(key, error)
    }

    fn call_scope(&self, key: &str) -> Option<Box<dyn Send>> {
        *self.open.lock().unwrap().entry(key.to_owned()).or_default() += 1;
        Some(Box::new(ScopeOf(self.clone(), key.to_owned())))
    }
}

#[tokio::test]
async fn every_write_of_a_guest_call_timers_included_is_made_inside_its_call_s_scope() {
    let runtime = runtime();
    for isolation in [Isolation::Job, Isolation::Worker] {
        let plugin = load(&runtime, COUNTER, options(isolation, &[("interval-ms", "50")]));
        let scoped = Scoped::default();
        let runner = plugin.runner(std::sync::Arc::new(scoped.clone()));
        runner.start(Job::new("short", "3")).await.unwrap();
        assert_eq!(runner.notify("short", b"reset".to_vec()).await, Ok(()));
        scoped
            .recorder
            .wait_until(PATIENCE, |o| o.iter().any(|o| matches!(o, Output::Complete { .. })))
            .await;
        let writes = scoped.writes.lock().unwrap().clone();
        // reset's save, then a save and an emit per tick and the
        // completion: all of them inside a call.
        assert!(writes.len() >= 8, "{isolation:?}: {writes:?}");
        assert!(
            writes.iter().all(|(_, _, open)| *open),
            "{isolation:?}: a write outside its call: {writes:?}"
        );
        assert_eq!(writes.last().map(|(_, what, _)| *what), Some("complete"));
        assert!(scoped.open.lock().unwrap().values().all(|n| *n == 0), "{isolation:?}: a scope left open");
    }
}
