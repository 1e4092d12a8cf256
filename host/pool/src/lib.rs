//! The worker pool: jobs keyed by name run on exactly one worker of a pool
//! of nodes sharing a Redis, chosen by Jump Consistent Hash of the key over
//! a fixed number of virtual slots, each held by one worker (the slot
//! table). Membership changes move slots from the most loaded workers to a
//! joiner and from a leaver to the least loaded; no other slot moves.
//!
//! # Layout
//! - `node`: [`Node`]: join (full or client-only), workers, dispatch, stop,
//!   notify, retry, forget, listing.
//! - `worker`: a worker's task: its inbox, its handler calls, in order.
//! - `core`: what a node's workers share: leases and fences, membership
//!   scripts, routing, reply waiters, the scripts' typed answers, emitted
//!   events on their way to Redis.
//! - `job`: [`Job`], [`JobHandler`], outcomes and states.
//! - `context`: [`JobContext`]: save state, emit, complete, fail, fenced by
//!   the job's token.
//! - `emitted`: [`EmittedEvents`]: what jobs emitted, read back.
//! - `ticker`: [`Ticker`], a named interval firing on one node per tick.
//! - `schedule`: [`Node::schedule`], a [`JobProducer`]'s [`Plan`] applied
//!   at every tick.
//! - `hash`: CRC-64 and Jump Consistent Hash, as Go Pulse routes; the
//!   number of virtual slots.
//! - `keys`, `scripts`, `wire`: Redis key names, the Lua scripts (`lua/`),
//!   the message formats.
//! - `options`, `metrics`, `error`: [`NodeOptions`] and [`WorkerOptions`],
//!   the pool's metrics, [`Error`].
//!
//! # How a dispatch runs
//! The dispatcher routes the key with its replica of the slot table and runs
//! one script with the table's revision: the script refuses a stale
//! revision, claims the key with a new fencing token and appends the start
//! to the worker's inbox. The worker starts the job and answers on the
//! dispatcher's reply stream, where a waiter was registered before anything
//! was sent. A batch (`Node::dispatch_batch`) claims each job the same way,
//! the jobs that route to one worker in one run of the script, every
//! script of the batch in one pipeline.
#![warn(missing_docs)]

mod context;
mod core;
mod emitted;
mod error;
pub mod hash;
mod job;
mod keys;
mod metrics;
mod node;
mod options;
mod schedule;
mod scripts;
mod ticker;
mod wire;
mod worker;

pub use context::{ContextError, JobContext};
pub use core::CallScope;
pub use emitted::{Emitted, EmittedEvents, Followed, Following};
pub use error::{Error, Result};
pub use job::{DispatchOutcome, EventOutcome, HandlerError, Job, JobEvent, JobHandler, JobInfo, JobState};
pub use keys::group_tag;
pub use node::{
    JobCounts, JobsPage, JobsQuery, MAX_PAGE, MAX_SCANS, Node, NodeInfo, PoolView, RefusedRelease, Rollout,
    RolloutOutcome, RolloutState, WorkerInfo,
};
pub use options::{Identity, NodeOptions, Release, WorkerOptions};
pub use schedule::{Applied, JobProducer, Plan, ProducerError, Schedule};
pub use ticker::{Tick, Ticker};
