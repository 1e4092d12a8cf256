//! The task that owns an instance and serializes its calls.
//!
//! An instance is driven by one task (an actor) that receives [`Command`]s
//! in order and makes one guest call at a time: this is what serializes the
//! calls to an instance and keeps the order per key. Timer ticks arrive on
//! the same channel, so they interleave with calls in arrival order.
//!
//! A call that traps, times out or exhausts a limit poisons the instance:
//! its store is dropped. So does a call whose caller stopped waiting for
//! a `stop` or `notify`: it is cut off at once (the guest yields at every
//! epoch tick), not left to burn a core until `call_timeout` for nobody. Jobs it served besides the one that failed (worker
//! isolation) are started again in a fresh instance, from the state they
//! last saved, with `requeued` set.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::bounds::gated;
use crate::error::CallError;
use crate::instance::{GuestCall, Instance};
use crate::job::Job;
use crate::outputs::JobOutputs;
use crate::plugin::{Isolation, PluginInner};
use crate::ready;

/// Commands queued per instance before callers wait: deep enough that a
/// burst of notifications does not stall its senders, small enough to bound
/// memory per instance.
pub(crate) const COMMAND_QUEUE: usize = 256;

/// A reply to a call.
pub(crate) type Reply = oneshot::Sender<Result<(), CallError>>;

/// An instance's queue of commands. They go boxed: the queue holds a
/// block of 32 from its instance's start to its end, 0.3 KiB as pointers
/// against 2.5 KiB inline (80 bytes a command at most, a start's job
/// boxed; BENCHMARKS.md, "A job's task and queue").
pub(crate) type Commands = mpsc::Sender<Box<Command>>;

/// The way timers reach an instance's queue (see [`Commands`]).
pub(crate) type WeakCommands = mpsc::WeakSender<Box<Command>>;

/// What an instance's task is asked to do.
pub(crate) enum Command {
    Start {
        job: Job,
        reply: Reply,
        /// The caller's trace span, which the call runs in (see
        /// [`traced_caller`]).
        traced: Option<tracing::Span>,
    },
    Stop {
        key: String,
        reply: Reply,
    },
    Notify {
        key: String,
        payload: Vec<u8>,
        reply: Reply,
        traced: Option<tracing::Span>,
    },
    Timer {
        key: String,
        name: String,
        generation: u64,
        /// When the tick was due.
        due: tokio::time::Instant,
    },
    /// Drop the job without calling into it.
    Abandon {
        key: String,
    },
    /// Tell the state the job saved last.
    SavedState {
        key: String,
        reply: oneshot::Sender<Option<Vec<u8>>>,
    },
}

/// Told when a job ends inside the instance, not as the answer to a call:
/// it completed, its timer callback failed, or its restart failed. Carries
/// the instance id, so a stale report never removes a newer instance's job.
pub(crate) type OnGone = Arc<dyn Fn(&str, u64) + Send + Sync>;

/// The task that owns an instance.
pub(crate) struct Actor {
    id: u64,
    plugin: Arc<PluginInner>,
    outputs: Arc<dyn JobOutputs>,
    commands: WeakCommands,
    on_gone: OnGone,
    live: Option<Instance>,
}

impl Actor {
    /// Spawns the task behind a new channel; the instance itself is created
    /// by the first `start`.
    pub(crate) fn spawn(
        id: u64,
        plugin: Arc<PluginInner>,
        outputs: Arc<dyn JobOutputs>,
        on_gone: OnGone,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Commands {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let span = tracing::info_span!("instance", plugin = %plugin.name, instance = id);
        let actor = Self { id, plugin, outputs, commands: tx.downgrade(), on_gone, live: None };
        tasks.spawn(actor.run(rx).instrument(span));
        tx
    }

    /// Serves commands until every sender is gone.
    ///
    /// Each command is served in a future of its own, on the heap while it
    /// runs: the task lives as long as its instance, and inline it would
    /// hold the largest command's state (about 4 KiB: a guest call's, or a
    /// start's that instantiates) for the whole life of every job, where
    /// waiting for the next command needs 0.6 KiB (BENCHMARKS.md, "A job's
    /// task and queue").
    async fn run(mut self, mut rx: mpsc::Receiver<Box<Command>>) {
        while let Some(command) = rx.recv().await {
            Box::pin(self.serve(*command)).await;
            self.report_completed();
        }
    }

    /// Serves one command.
    async fn serve(&mut self, command: Command) {
        match command {
            // A start runs to its end: cut mid-way, it would drop the
            // instance it took out with the other jobs in it.
            Command::Start { job, reply, traced } => {
                let answer = match traced {
                    Some(span) => self.start(job).instrument(span).await,
                    None => self.start(job).await,
                };
                let _ = reply.send(answer);
            }
            Command::Stop { key, mut reply } => {
                let answer = unless_abandoned(self.stop(&key), &mut reply).await;
                self.answer(&key, answer, reply).await;
            }
            Command::Notify { key, payload, mut reply, traced } => {
                let answer = match traced {
                    Some(span) => {
                        unless_abandoned(self.notify(&key, &payload).instrument(span), &mut reply).await
                    }
                    None => unless_abandoned(self.notify(&key, &payload), &mut reply).await,
                };
                self.answer(&key, answer, reply).await;
            }
            Command::Timer { key, name, generation, due } => self.tick(&key, &name, generation, due).await,
            Command::Abandon { key } => {
                if let Some(live) = self.live.as_mut() {
                    live.drop_job(&key);
                }
            }
            Command::SavedState { key, reply } => {
                let state = self.live.as_mut().and_then(|live| live.jobs().get(&key)?.job.state.clone());
                let _ = reply.send(state);
            }
        }
    }

    /// Sends a call's answer; `None` when the call was cut off because
    /// its caller stopped waiting: the guest stopped mid-call, so its
    /// instance is discarded like one that timed out (the job of the call
    /// with it, the others started again).
    async fn answer(&mut self, key: &str, answer: Option<Result<(), CallError>>, reply: Reply) {
        let answer = match answer {
            Some(answer) => answer,
            None => {
                let error = CallError::Abandoned(key.to_owned());
                tracing::warn!(job.key = key, "the call's caller stopped waiting; the call was cut off");
                // Discards the instance, and with it the job; starts the
                // others again.
                self.after_failure(key, &error).await;
                // Nobody takes the answer that would have forgotten it.
                (self.on_gone)(key, self.id);
                Err(error)
            }
        };
        let _ = reply.send(answer);
    }

    fn runs(&self, key: &str) -> bool {
        self.live.as_ref().is_some_and(|live| live.runs(key))
    }

    /// Refuses a call for `key` when the host says its code may not run.
    fn fence(&self, key: &str) -> Result<(), CallError> {
        if self.outputs.may_run(key) { Ok(()) } else { Err(CallError::Fenced(key.to_owned())) }
    }

    async fn start(&mut self, job: Job) -> Result<(), CallError> {
        if self.runs(&job.key) {
            return Err(CallError::AlreadyRunning(job.key));
        }
        self.fence(&job.key)?;
        let mut live = match self.live.take() {
            Some(live) => live,
            None => self.instantiate().await?,
        };
        let result = live.start(&job).await;
        self.live = Some(live);
        if let Err(error) = &result {
            self.after_failure(&job.key, error).await;
        }
        result
    }

    async fn stop(&mut self, key: &str) -> Result<(), CallError> {
        self.fence(key)?;
        let Some(live) = self.live.as_mut() else { return Err(CallError::NotRunning(key.to_owned())) };
        let result = live.stop(key).await;
        if let Err(error) = &result {
            self.after_failure(key, error).await;
        }
        result
    }

    async fn notify(&mut self, key: &str, payload: &[u8]) -> Result<(), CallError> {
        self.fence(key)?;
        let Some(live) = self.live.as_mut() else { return Err(CallError::NotRunning(key.to_owned())) };
        let result = live.notify(key, payload).await;
        if let Err(error) = &result {
            self.after_failure(key, error).await;
        }
        result
    }

    async fn tick(&mut self, key: &str, name: &str, generation: u64, due: tokio::time::Instant) {
        if !self.outputs.may_run(key) {
            return; // the job is about to be dropped: its timers run no more
        }
        let Some(live) = self.live.as_mut() else { return };
        let armed = live.jobs().get_mut(key).is_some_and(|slot| slot.take_tick(name, generation));
        if !armed {
            return; // cancelled, replaced, or the job is gone
        }
        live.timer_late(due.elapsed());
        match live.call(GuestCall::Timer(key, name)).await {
            Ok(()) => {}
            Err(error) if !error.ends_job() => {
                // A timer may fail every few milliseconds: its lines count
                // against the job's log budget.
                let gate = live.log_gate();
                let line = format!("timer {name:?} callback failed: {error}");
                gated(&gate, Some(key), &line, |line| tracing::warn!(job.key = key, "{line}"));
            }
            Err(error) => {
                live.drop_job(key);
                self.after_failure(key, &error).await;
                self.end_job(key, &error).await;
            }
        }
    }

    /// Reports jobs that completed during the last call.
    fn report_completed(&mut self) {
        let Some(live) = self.live.as_mut() else { return };
        for key in live.take_completed() {
            (self.on_gone)(&key, self.id);
        }
    }

    /// A job ended here without a caller to tell: report it. (`&mut self`
    /// only because `Actor` is `Send` but not `Sync`.)
    async fn end_job(&mut self, key: &str, error: &CallError) {
        tracing::warn!(job.key = key, error = %error, "job failed");
        self.outputs.job_failed(key, error).await;
        (self.on_gone)(key, self.id);
    }

    /// After a failed call: if it poisoned the instance, drop it and start
    /// its other jobs again in a new one, from the state they saved last.
    async fn after_failure(&mut self, failed_key: &str, error: &CallError) {
        if !error.poisons_instance() {
            return;
        }
        let Some(mut dead) = self.live.take() else { return };
        let survivors: Vec<Job> = dead.take_jobs().into_iter().filter(|job| job.key != failed_key).collect();
        drop(dead);
        tracing::warn!(error = %error, restarting = survivors.len(), "instance discarded");
        for mut job in survivors {
            job.requeued = true;
            // A restart that poisons the new instance restarts the rest again,
            // each time with one job fewer: this ends.
            if let Err(error) = Box::pin(self.start(job.clone())).await {
                self.end_job(&job.key, &error).await;
            }
        }
    }

    /// A new instance for this task: in job isolation one made ahead of
    /// need when there is one (`ready`).
    async fn instantiate(&mut self) -> Result<Instance, CallError> {
        if self.plugin.isolation != Isolation::Job {
            return self.make().await;
        }
        let made = match ready::take(&self.plugin, &self.outputs, &self.commands) {
            Some(instance) => Ok(instance),
            None => self.make().await,
        };
        ready::started(&self.plugin);
        made
    }

    /// Instantiates; one refused for room is tried once more after every
    /// plugin's ready instances are dropped. (`&mut self` only because
    /// `Actor` is `Send` but not `Sync`.)
    async fn make(&mut self) -> Result<Instance, CallError> {
        let new = || Instance::new(&self.plugin, self.outputs.clone(), self.commands.clone());
        match new().await {
            Err(error @ CallError::Instantiate(_)) => {
                let held = self.plugin.ready_registry.hold().await;
                if held.drain() { new().await } else { Err(error) }
            }
            made => made,
        }
    }
}

/// The outcome of `call`, or `None` once its caller stopped waiting for
/// `reply` (then `call` is dropped: the guest stops at its next epoch
/// tick).
async fn unless_abandoned<F: Future>(call: F, reply: &mut Reply) -> Option<F::Output> {
    tokio::select! {
        // A call that returned is answered, even if its caller just left.
        biased;
        answer = call => Some(answer),
        () = reply.closed() => None,
    }
}

/// The caller's current span when it is a trace span: the guest call runs
/// in it, on the instance's task, so the requests the guest sends are its
/// children. `None` when traces are not exported.
pub(crate) fn traced_caller() -> Option<tracing::Span> {
    if !tracing::enabled!(target: pulse_telemetry::TARGET, tracing::Level::TRACE) {
        return None;
    }
    let span = tracing::Span::current();
    span.metadata().is_some_and(|meta| meta.target() == pulse_telemetry::TARGET).then_some(span)
}
