//! Jobs, the handler trait, and what a handler can ask of the pool.

use std::future::Future;

/// A job as a handler starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its key, unique in the pool.
    pub key: String,
    /// The payload given at dispatch.
    pub payload: Vec<u8>,
    /// When the pool accepted it, ms since the Unix epoch (Redis time).
    pub created_at_ms: u64,
    /// Whether it ran before and is started again.
    pub requeued: bool,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// The state it saved last.
    pub state: Option<Vec<u8>>,
}

/// Why a handler refused or failed a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// The input can never succeed: a refused start removes the job.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// May succeed later: a start is retried with backoff.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The job cannot go on: it is marked failed.
    #[error("fatal: {0}")]
    Fatal(String),
    /// This worker cannot run the job now, but another may: the job is
    /// neither failed nor retried here. A start so answered stays the
    /// worker's, unstarted and without counting an attempt, with the
    /// events sent to it meanwhile, until the worker leaves: then it goes
    /// back to the pool, events and all, and starts on its next worker
    /// from the state it saved. A notification so answered holds its
    /// running job the same way, from that notification on (it is
    /// delivered again, and answered, by the next worker). A release on
    /// trial answers so for the jobs it fails (see the host's upgrade
    /// gate).
    #[error("held: {0}")]
    Held(String),
}

/// Runs the jobs of a worker. Calls for one key come in order: `start`,
/// then `notify`s, then `stop`.
pub trait JobHandler: Send + Sync + 'static {
    /// Starts `job`; `ctx` is how it talks back to the pool.
    fn start(
        &self,
        job: Job,
        ctx: crate::JobContext,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Stops job `key` (on request, or because it moves).
    fn stop(&self, key: &str) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Delivers notification number `seq` of job `key`.
    fn notify(
        &self,
        key: &str,
        payload: Vec<u8>,
        seq: u64,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Drops job `key` without running any of its code (no `stop`, no
    /// timer): the worker lost its lease, and the job may already run on
    /// another worker. The default does nothing, for handlers that keep no
    /// per-job resources.
    fn abandon(&self, key: &str) -> impl Future<Output = ()> + Send {
        let _ = key;
        std::future::ready(())
    }

    /// The state job `key` saved last through its context, if the handler
    /// keeps it. Asked when Redis lost the pool's data: the worker writes
    /// it back with the job, so the job's next start (here or on another
    /// worker) resumes from it rather than from nothing. The default keeps
    /// none.
    fn saved_state(&self, key: &str) -> impl Future<Output = Option<Vec<u8>>> + Send {
        let _ = key;
        std::future::ready(None)
    }
}

/// One handler shared: a worker of a pool of several slot groups is a
/// member of each, and every member calls the same handler.
impl<H: JobHandler> JobHandler for std::sync::Arc<H> {
    fn start(
        &self,
        job: Job,
        ctx: crate::JobContext,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        H::start(self, job, ctx)
    }

    fn stop(&self, key: &str) -> impl Future<Output = Result<(), HandlerError>> + Send {
        H::stop(self, key)
    }

    fn notify(
        &self,
        key: &str,
        payload: Vec<u8>,
        seq: u64,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        H::notify(self, key, payload, seq)
    }

    fn abandon(&self, key: &str) -> impl Future<Output = ()> + Send {
        H::abandon(self, key)
    }

    fn saved_state(&self, key: &str) -> impl Future<Output = Option<Vec<u8>>> + Send {
        H::saved_state(self, key)
    }
}

/// What the pool knows of a job. Serialized (for the API and the command
/// line's `--json`) as `{"key", "state", "worker", "created_at_ms",
/// "attempt", "reason"}`, the state in its one string form, and
/// `"history"` when it was read (a job's status, not a listing).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobInfo {
    /// Its key.
    pub key: String,
    /// Its state.
    pub state: JobState,
    /// The worker running it, if any.
    pub worker: Option<String>,
    /// When it was accepted (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// Its attempt.
    pub attempt: u32,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    /// How it got here, oldest first (its dispatch, then each start on a
    /// worker after the first, each hand-back, eviction, failure and
    /// retry; the last 1 KiB of them): read for one job's status only,
    /// empty in listings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<JobEvent>,
}

/// A line of a job's history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobEvent {
    /// When, ms since the Unix epoch (Redis time).
    pub at_ms: u64,
    /// `dispatched`, `started` (on a worker, after a wait or a move: the
    /// first start of a dispatch to a live worker is the dispatch's),
    /// `returned` (its worker handed it back, leaving or rebalancing),
    /// `evicted` (its worker was declared dead), `failed` or `retried`.
    pub event: String,
    /// The worker it concerns.
    pub worker: Option<String>,
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Sent to a worker, whose handler has not confirmed the start yet
    /// (the start is still in the worker's inbox). A listing's view only:
    /// Redis holds such a job as running.
    Starting,
    /// Owned by a worker, whose handler started it.
    Running,
    /// Being handed back by its worker; its events are held.
    Moving,
    /// Waiting for a worker.
    Queued,
    /// Failed; its key is blocked until `retry` or `forget`.
    Failed,
}

impl JobState {
    /// Every state, in the order a job may pass through them.
    pub const ALL: [JobState; 5] =
        [JobState::Starting, JobState::Running, JobState::Moving, JobState::Queued, JobState::Failed];

    /// The state's one string form, the same in Redis, the API and the
    /// command line: `starting`, `running`, `moving`, `queued`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Moving => "moving",
            JobState::Queued => "queued",
            JobState::Failed => "failed",
        }
    }

    /// The state written `text` ([`JobState::as_str`]); `None` for
    /// anything else.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }

    /// [`JobState::parse`], or what a listing's filter says of `text`:
    /// `"…": allowed are starting, running, …` (the caller names the
    /// option before it).
    pub fn parse_filter(text: &str) -> Result<Self, String> {
        Self::parse(text).ok_or_else(|| {
            let allowed: Vec<&str> = Self::ALL.iter().map(|state| state.as_str()).collect();
            format!("{text:?}: allowed are {}", allowed.join(", "))
        })
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for JobState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The answer to [`crate::Node::dispatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchOutcome {
    /// A worker started the job.
    Started,
    /// No worker is alive: the job waits and starts when one joins.
    Queued,
    /// The key is taken (running, queued or failed).
    AlreadyExists(JobState),
    /// The handler refused the job (invalid input); it was not kept.
    Refused(String),
    /// The handler failed the job (fatal, or retries exhausted); it is
    /// listed as failed.
    Failed(String),
    /// The pool holds `max_jobs` jobs.
    PoolFull,
    /// Accepted, but no confirmation came in time; a retry answers
    /// `AlreadyExists`.
    Unconfirmed,
}

/// The answer to [`crate::Node::stop`] and [`crate::Node::notify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// The handler was called and returned `Ok` (a stop: the job is gone).
    Done,
    /// The job waits for a worker: the event is held, in order, for after
    /// its start. (A stop of a waiting job with nothing held is immediate:
    /// `Done`.)
    Held,
    /// No job has this key.
    NoSuchJob,
    /// The job is failed, with this reason.
    JobFailed(String),
    /// The handler returned this error (a stop: the job is gone anyway).
    HandlerError(String),
    /// Sent, but no confirmation came in time.
    Unconfirmed,
}
