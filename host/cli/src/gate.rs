//! The upgrade gate. A new release of a plugin replaces this host's
//! workers one at a time; each new worker is on trial for the plugin's
//! `upgrade_window` and judged before the next is replaced:
//!
//! - **failures**: jobs the new release ended (a fatal error, a trap, an
//!   exhausted limit in `start`, `notify` or a timer; a `start` of a job
//!   with saved state refused as invalid input), per job it was given,
//!   against the same ratio of the release it replaced plus
//!   `upgrade_max_failed_percent`. Judged as each failure comes: a release
//!   that fails every job it inherits is caught at its first failures, not
//!   at the window's end.
//! - **progress**: a worker whose jobs wrote nothing (no emit, no saved
//!   state, no completion) over the whole window, where the worker it
//!   replaced had written within the window before it was replaced, has
//!   stalled. (Jobs that only write when called are not judged by it.)
//!
//! While on trial, a job the new release fails is not marked failed: it is
//! *held* (the pool's [`HandlerError::Held`]): it stays the worker's,
//! unstarted or stopped, without counting an attempt. A release that fails
//! its gate is undone: its workers are replaced back by the release they
//! replaced, so its held jobs move there and start again from the state
//! they saved, with their events. A release that passes fails its held
//! jobs for real then (they failed on a release judged good).
//!
//! [`HandlerError::Held`]: pulse_pool::HandlerError::Held

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pulse_pool::JobContext;
use tokio::sync::Notify;

/// What one worker's plugin did, counted by its handler; and, while the
/// worker is on trial, the jobs its release failed, held.
pub(crate) struct Record {
    started: AtomicU64,
    failed: AtomicU64,
    outputs: AtomicU64,
    created: Instant,
    /// When a job last wrote: ms after `created`, plus 1 (0: never).
    last_output: AtomicU64,
    trial: AtomicBool,
    /// Held jobs: key -> their context (to fail them for real if the
    /// release passes) and why they failed.
    held: Mutex<HashMap<String, Held>>,
    /// The first reasons, for the verdict.
    reasons: Mutex<Vec<String>>,
    failure: Notify,
}

/// A job the release on trial failed.
struct Held {
    ctx: Option<JobContext>,
    reason: String,
}

/// Reasons a verdict quotes at most.
const REASONS: usize = 3;

/// What a worker did, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    /// Jobs it was given (starts).
    pub(crate) started: u64,
    /// Jobs its release ended (failed, or held on trial).
    pub(crate) failed: u64,
    /// Emits, saved states and completions of its jobs.
    pub(crate) outputs: u64,
    /// How long ago a job last wrote (`None`: never).
    pub(crate) last_output: Option<Duration>,
}

impl Figures {
    /// Failed per started, in percent (0 before any start).
    fn failed_percent(self) -> f64 {
        if self.started == 0 { 0.0 } else { self.failed as f64 * 100.0 / self.started as f64 }
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} job(s) started, {} failed ({:.1}%), {} write(s)",
            self.started,
            self.failed,
            self.failed_percent(),
            self.outputs
        )
    }
}

impl Default for Record {
    fn default() -> Self {
        Self {
            started: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            outputs: AtomicU64::new(0),
            created: Instant::now(),
            last_output: AtomicU64::new(0),
            trial: AtomicBool::new(false),
            held: Mutex::default(),
            reasons: Mutex::default(),
            failure: Notify::new(),
        }
    }
}

impl Record {
    /// The record of a worker on trial from its first call: its jobs
    /// reach it while it joins, before the trial's window starts.
    pub(crate) fn on_trial() -> Self {
        Self { trial: AtomicBool::new(true), ..Self::default() }
    }

    pub(crate) fn figures(&self) -> Figures {
        let last = self.last_output.load(Ordering::Relaxed);
        Figures {
            started: self.started.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            outputs: self.outputs.load(Ordering::Relaxed),
            last_output: (last > 0)
                .then(|| self.created.elapsed().saturating_sub(Duration::from_millis(last - 1))),
        }
    }

    pub(crate) fn started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn output(&self) {
        self.outputs.fetch_add(1, Ordering::Relaxed);
        let at = u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        self.last_output.store(at, Ordering::Relaxed);
    }

    /// Counts a job the release ended; returns whether it is held (the
    /// worker is on trial) rather than to be failed.
    pub(crate) fn failed(&self, key: &str, reason: &str, ctx: Option<JobContext>) -> bool {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let held = self.trial.load(Ordering::Acquire);
        if held {
            lock(&self.held).insert(key.to_owned(), Held { ctx, reason: reason.to_owned() });
            let mut reasons = lock(&self.reasons);
            if reasons.len() < REASONS {
                reasons.push(format!("job {key:?}: {reason}"));
            }
        }
        self.failure.notify_one();
        held
    }

    /// Why job `key` is held, if it is.
    pub(crate) fn held(&self, key: &str) -> Option<String> {
        lock(&self.held).get(key).map(|held| held.reason.clone())
    }

    /// Forgets held job `key` (it left the worker).
    pub(crate) fn release(&self, key: &str) {
        lock(&self.held).remove(key);
    }

    /// Jobs held now.
    pub(crate) fn held_count(&self) -> usize {
        lock(&self.held).len()
    }

    /// Ends the trial of a release judged good: the jobs it held are
    /// failed for real (they failed on a good release).
    pub(crate) async fn fail_held(&self) {
        self.trial.store(false, Ordering::Release);
        let held: Vec<(String, Held)> = lock(&self.held).drain().collect();
        for (key, held) in held {
            let Some(ctx) = held.ctx else { continue };
            if let Err(error) = ctx.fail(&held.reason).await {
                tracing::warn!(job.key = %key, error = %error, "failed to record the failure of a held job");
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Held for one map operation, never across an await.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// How a release is judged: `[[plugin]] upgrade_window` and
/// `upgrade_max_failed_percent`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    pub(crate) window: Duration,
    pub(crate) max_failed_percent: u32,
}

/// The gate's verdict on one worker.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Judged good: what the new worker did over the window.
    Passed(Figures),
    /// Judged bad: why, in words (figures and first failures).
    Failed(String),
    /// The host was asked to leave before the verdict.
    Interrupted,
}

impl Gate {
    /// Judges the worker of `new` (on trial since it was made, see
    /// [`Record::on_trial`]; it just replaced the one of `old`, which did
    /// `old`'s figures) over the window; `leave` resolves when the host is
    /// asked to leave.
    pub(crate) async fn judge(&self, new: &Record, old: Figures, leave: impl Future<Output = ()>) -> Verdict {
        let deadline = tokio::time::Instant::now() + self.window;
        let allowed = old.failed_percent() + f64::from(self.max_failed_percent);
        let too_many = |now: Figures| now.failed > 0 && now.failed_percent() > allowed;
        futures_util::pin_mut!(leave);
        loop {
            let now = new.figures();
            if too_many(now) {
                let reasons = lock(&new.reasons).join("; ");
                break Verdict::Failed(format!(
                    "{now}, where the release it replaced failed {:.1}% of its jobs and {} more point(s) are allowed (upgrade_max_failed_percent); first failures: {reasons}",
                    old.failed_percent(),
                    self.max_failed_percent,
                ));
            }
            tokio::select! {
                () = new.failure.notified() => {}
                () = tokio::time::sleep_until(deadline) => {
                    let now = new.figures();
                    if too_many(now) {
                        continue;
                    }
                    let old_wrote = old.last_output.is_some_and(|ago| ago <= self.window);
                    if now.started > 0 && now.outputs == 0 && old_wrote {
                        break Verdict::Failed(format!(
                            "{now} over {:?} (upgrade_window): its jobs made no progress, where the release it replaced wrote within the window before",
                            self.window
                        ));
                    }
                    break Verdict::Passed(now);
                }
                () = &mut leave => break Verdict::Interrupted,
            }
        }
    }
}

/// The metrics of one trial: `pulse_rollout_trial{pool}` is 1 while it
/// runs; its verdict counts in `pulse_rollout_verdicts_total{pool,
/// verdict}` and the jobs it held in `pulse_rollout_held_jobs_total{pool}`.
pub(crate) struct TrialMetrics {
    pool: String,
}

impl TrialMetrics {
    pub(crate) fn start(pool: &str) -> Self {
        metrics::gauge!("pulse_rollout_trial", "pool" => pool.to_owned()).increment(1.0);
        Self { pool: pool.to_owned() }
    }

    pub(crate) fn verdict(&self, verdict: &Verdict, held: usize) {
        let name = match verdict {
            Verdict::Passed(_) => "passed",
            Verdict::Failed(_) => "failed",
            Verdict::Interrupted => "interrupted",
        };
        metrics::counter!("pulse_rollout_verdicts_total", "pool" => self.pool.clone(), "verdict" => name)
            .increment(1);
        metrics::counter!("pulse_rollout_held_jobs_total", "pool" => self.pool.clone())
            .increment(held as u64);
    }
}

impl Drop for TrialMetrics {
    fn drop(&mut self) {
        metrics::gauge!("pulse_rollout_trial", "pool" => self.pool.clone()).decrement(1.0);
    }
}
