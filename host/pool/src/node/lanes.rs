//! Single dispatches that set out together share a script: while a
//! node's `dispatch.lua` is on its way, the untraced starts routed with the
//! same slot table revision wait, whichever workers of the node's slot
//! group they go to, and the next script takes all of them (up to
//! [`GROUP`]), as a batch's starts go. A script of one job costs Redis
//! more than twice what each job of a batch does (callgrind: 133k
//! instructions against 57k a job in a batch of 100: the call and its
//! set-up), so with many dispatchers at once each job pays a share of
//! one. A dispatch that finds nothing on its way is sent at once; each job
//! is still claimed on its own, with its own token and answer, in the
//! order the dispatches came.
//!
//! The scripts are sent by a task of their own per revision, never by the
//! caller's future: a dispatch whose caller stops waiting leaves the jobs
//! that waited behind it on their way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::core::{Core, Dispatched};
use crate::error::Result;
use crate::scripts;

use super::batch::GROUP;
use super::dispatch::{Start, dispatch_cmd, dispatched};

/// A lane: the slot table revision its jobs were routed with (a script
/// checks one).
type Lane = u64;

/// A job waiting in its lane, and where its answer goes: the script's
/// answer for it, or why the script failed.
struct Waiting {
    worker: String,
    reply: String,
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

    /// Sends `start`, routed with revision `rev`, with the next script of
    /// its lane: the script's answer for it.
    pub(crate) async fn dispatch(
        self: &Arc<Self>,
        core: &Arc<Core>,
        rev: u64,
        start: Start<'_>,
    ) -> redis::RedisResult<Result<Dispatched>> {
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting {
            worker: start.worker.to_owned(),
            reply: start.reply.to_owned(),
            key: start.key.to_owned(),
            payload: start.payload.to_vec(),
            request: start.request.to_owned(),
            answer,
        };
        let start = {
            let mut lanes = self.lock();
            match lanes.get_mut(&rev) {
                Some(queue) => {
                    queue.push(waiting);
                    false
                }
                None => {
                    lanes.insert(rev, vec![waiting]);
                    true
                }
            }
        };
        if start {
            tokio::spawn(send(self.clone(), core.clone(), rev));
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
            next_script(queue)
        };
        let group: Vec<Start<'_>> = jobs
            .iter()
            .map(|job| Start {
                worker: &job.worker,
                reply: &job.reply,
                key: &job.key,
                payload: &job.payload,
                request: &job.request,
            })
            .collect();
        let cmd = dispatch_cmd(&core, lane, "", &group);
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

/// Takes the jobs of the next script from the front of `queue`: up to
/// [`GROUP`], and not past a job whose worker is answered on another
/// stream than its earlier jobs in the script (a script names each
/// worker's inbox once, with one reply stream; a worker's stream changes
/// only when it could not be opened).
fn next_script(queue: &mut Vec<Waiting>) -> Vec<Waiting> {
    let mut replies: Vec<(&str, &str)> = Vec::new();
    let mut count = 0;
    for job in queue.iter().take(GROUP) {
        match replies.iter().find(|(worker, _)| *worker == job.worker) {
            Some((_, reply)) if *reply != job.reply => break,
            Some(_) => {}
            None => replies.push((&job.worker, &job.reply)),
        }
        count += 1;
    }
    let rest = queue.split_off(count);
    std::mem::replace(queue, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(worker: &str, reply: &str, key: &str) -> Waiting {
        Waiting {
            worker: worker.into(),
            reply: reply.into(),
            key: key.into(),
            payload: Vec::new(),
            request: String::new(),
            answer: oneshot::channel().0,
        }
    }

    fn keys(jobs: &[Waiting]) -> Vec<&str> {
        jobs.iter().map(|job| job.key.as_str()).collect()
    }

    #[test]
    fn a_script_takes_every_worker_s_jobs_in_order_until_a_worker_s_stream_changes() {
        let mut queue = vec![
            waiting("w1", "r1", "a"),
            waiting("w2", "r2", "b"),
            waiting("w1", "r1", "c"),
            waiting("w2", "node", "d"),
            waiting("w3", "r3", "e"),
        ];
        assert_eq!(keys(&next_script(&mut queue)), ["a", "b", "c"]);
        assert_eq!(keys(&next_script(&mut queue)), ["d", "e"]);
        assert!(queue.is_empty());
    }

    #[test]
    fn a_script_takes_at_most_a_group() {
        let mut queue: Vec<Waiting> = (0..GROUP + 3).map(|i| waiting("w1", "r1", &i.to_string())).collect();
        assert_eq!(next_script(&mut queue).len(), GROUP);
        let rest: Vec<String> = (GROUP..GROUP + 3).map(|i| i.to_string()).collect();
        assert_eq!(keys(&queue), rest);
    }
}
