//! Single dispatches that set out together share a script: while a
//! node's `dispatch.lua` to a worker is on its way, the untraced starts
//! routed to that worker (with the same slot table revision) wait, and
//! the next script takes all of them (up to [`GROUP`]), as a batch's
//! starts go. A script of one job costs Redis more than twice what each
//! job of a batch does (callgrind: 133k instructions against 57k a job in
//! a batch of 100: the call and its set-up), so with many dispatchers at
//! once each job pays a share of one. A dispatch that finds nothing on
//! its way is sent at once; each job is still claimed on its own, with its
//! own token and answer, in the order the dispatches came.
//!
//! The scripts are sent by a task of their own per worker, never by the
//! caller's future: a dispatch whose caller stops waiting leaves the jobs
//! that waited behind it on their way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::core::{Core, Dispatched};
use crate::error::Result;
use crate::scripts;

use super::batch::GROUP;
use super::dispatch::{dispatch_cmd, dispatched};

/// Where a lane's jobs go: the revision they were routed with, their
/// worker and the stream its answers go to.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Lane {
    rev: u64,
    worker: String,
    reply: String,
}

/// A job waiting in its lane, and where its answer goes: the script's
/// answer for it, or why the script failed.
struct Waiting {
    key: String,
    payload: Vec<u8>,
    request: String,
    answer: oneshot::Sender<redis::RedisResult<Result<Dispatched>>>,
}

/// The lanes that have a script on its way, each with the jobs that wait
/// for the next one. A lane is here exactly while its task runs.
#[derive(Default)]
pub(crate) struct Lanes(Mutex<HashMap<Lane, Vec<Waiting>>>);

impl Lanes {
    fn lock(&self) -> MutexGuard<'_, HashMap<Lane, Vec<Waiting>>> {
        // Held for one lookup or update, never across an await.
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Sends the start of job `key` to `worker` with the next script of
    /// its lane, answered on `reply` for `request`: the script's answer
    /// for it.
    pub(crate) async fn dispatch(
        self: &Arc<Self>,
        core: &Arc<Core>,
        (rev, worker, reply): (u64, &str, &str),
        (key, payload, request): (&str, &[u8], &str),
    ) -> redis::RedisResult<Result<Dispatched>> {
        let (answer, answered) = oneshot::channel();
        let waiting =
            Waiting { key: key.to_owned(), payload: payload.to_vec(), request: request.to_owned(), answer };
        let lane = Lane { rev, worker: worker.to_owned(), reply: reply.to_owned() };
        let start = {
            let mut lanes = self.lock();
            match lanes.get_mut(&lane) {
                Some(queue) => {
                    queue.push(waiting);
                    false
                }
                None => {
                    lanes.insert(lane.clone(), vec![waiting]);
                    true
                }
            }
        };
        if start {
            tokio::spawn(send(self.clone(), core.clone(), lane));
        }
        answered.await.unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::other("the dispatch's task ended")))
        })
    }
}

/// Sends `lane`'s waiting jobs, a script at a time, until none wait.
async fn send(lanes: Arc<Lanes>, core: Arc<Core>, lane: Lane) {
    loop {
        let jobs: Vec<Waiting> = {
            let mut all = lanes.lock();
            let Some(queue) = all.get_mut(&lane) else { return };
            if queue.is_empty() {
                all.remove(&lane);
                return;
            }
            let rest = queue.split_off(queue.len().min(GROUP));
            std::mem::replace(queue, rest)
        };
        let group: Vec<(&str, &[u8], &str)> =
            jobs.iter().map(|job| (job.key.as_str(), job.payload.as_slice(), job.request.as_str())).collect();
        let cmd = dispatch_cmd(&core, lane.rev, &lane.worker, &lane.reply, "", &group);
        match scripts::query(&scripts::DISPATCH, &cmd, &mut core.conn.clone()).await {
            Ok(value) => {
                let answers = dispatched(value, jobs.len());
                for (job, answer) in jobs.into_iter().zip(answers) {
                    let _ = job.answer.send(Ok(answer));
                }
            }
            Err(error) => {
                for job in jobs {
                    let _ = job.answer.send(Err(error.clone()));
                }
            }
        }
    }
}
