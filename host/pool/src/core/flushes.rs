//! A host's workers of one slot group flush together: while a flush of the
//! group is on its way, the workers whose jobs' writes are ready wait, and
//! the next flush takes all of them, in one pipeline with one `write.lua`
//! for their writes (see `core::emits`). A flush of answers and deletions
//! alone goes at once, on its own: those plain commands cost Redis the
//! same together or apart.
//!
//! Why: most of a `write.lua` call's cost does not depend on how many
//! items it carries (callgrind: about 100k of the 157k instructions of a
//! flush of 3 jobs are the call, the fence's `HMGET`, the events counters
//! and the events' entry). Each worker flushing on its own carried about 3
//! jobs a call with 32 dispatchers over 4 workers; together they carry what
//! the four made meanwhile. A flush that finds none on its way is sent at
//! once, so an idle pool waits for nothing.
//!
//! Order and fencing do not change: each worker's batches still reach
//! Redis one at a time and in order (a flush holds each of its workers'
//! sending locks until it is answered), and each item is still fenced by
//! its job's token and worker in the script.
//!
//! A flush takes the waiting queues until their writes come to a worker
//! queue's bound ([`QUEUE_BYTES`] of payload; always the first queue):
//! one script is no longer than a worker's own flush could be, so it
//! holds Redis no longer either. The others go with the next flush.
//!
//! The flushes are sent by a task of their own, never by a worker's
//! future, as the dispatch lanes are (`node::lanes`).

use std::sync::{Arc, Mutex, MutexGuard};

use redis::RedisResult;
use tokio::sync::oneshot;

use super::Core;
use super::emits::{EmitQueue, QUEUE_BYTES, send_together};

/// A worker's queue waiting for the next flush, and where its outcome goes.
type Waiting = (Arc<EmitQueue>, oneshot::Sender<RedisResult<()>>);

/// The slot group's flushes: `None` while none is on its way; otherwise
/// the queues that wait for the next one.
#[derive(Default)]
pub(crate) struct Flushes(Mutex<Option<Vec<Waiting>>>);

impl Flushes {
    fn lock(&self) -> MutexGuard<'_, Option<Vec<Waiting>>> {
        // Held for one update, never across an await.
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// Sends what `queue` has ready: with the next flush of `core`'s slot group
/// (at once when none is on its way) when its jobs wrote, alone otherwise;
/// whether it reached Redis.
pub(crate) async fn flush(core: &Arc<Core>, queue: &Arc<EmitQueue>) -> RedisResult<()> {
    if !queue.has_writes_ready() {
        // Answers and deletions alone cost Redis the same, together or not.
        return queue.send(core, &[]).await.map(drop);
    }
    let (answer, answered) = oneshot::channel();
    let start = {
        let mut flushes = core.flushes.lock();
        match &mut *flushes {
            Some(waiting) => {
                waiting.push((queue.clone(), answer));
                false
            }
            None => {
                *flushes = Some(vec![(queue.clone(), answer)]);
                true
            }
        }
    };
    if start {
        tokio::spawn(send(core.clone()));
    }
    answered
        .await
        .unwrap_or_else(|_| Err(redis::RedisError::from(std::io::Error::other("the flush's task ended"))))
}

/// Sends the waiting queues, a flush at a time, until none wait.
async fn send(core: Arc<Core>) {
    loop {
        let mut waiting = {
            let mut flushes = core.flushes.lock();
            match &mut *flushes {
                Some(waiting) if !waiting.is_empty() => std::mem::take(waiting),
                _ => {
                    *flushes = None;
                    return;
                }
            }
        };
        // Sized with the lane unlocked: a queue's size takes its own lock.
        let next = waiting.split_off(taken(&waiting, QUEUE_BYTES));
        if !next.is_empty() {
            // Still `Some`: only this task sets it to `None`. The queues
            // left go first, before those that came meanwhile.
            if let Some(waiting) = &mut *core.flushes.lock() {
                let arrived = std::mem::replace(waiting, next);
                waiting.extend(arrived);
            }
        }
        // A queue is in a flush once: its sending lock is taken once.
        let mut queues: Vec<Arc<EmitQueue>> = Vec::with_capacity(waiting.len());
        for (queue, _) in &waiting {
            if !queues.iter().any(|known| Arc::ptr_eq(known, queue)) {
                queues.push(queue.clone());
            }
        }
        let result = send_together(&core, &queues).await;
        for (_, answer) in waiting {
            let _ = answer.send(result.clone());
        }
    }
}

/// How many of the first `waiting` queues one flush takes: while their
/// writes come to at most `bytes` together, and always the first.
fn taken(waiting: &[Waiting], bytes: usize) -> usize {
    let mut total = 0;
    waiting
        .iter()
        .take_while(|(queue, _)| {
            total += queue.bytes();
            total <= bytes
        })
        .count()
        .max(1)
}
