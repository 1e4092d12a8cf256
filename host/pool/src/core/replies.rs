//! The node's reply streams, where workers answer dispatches, stops and
//! notifications (on a pool read by doorbells, each worker answers
//! dispatches on a stream of its own: [`WorkerReplies`]), and the waiters
//! that match answers to callers.
//!
//! A caller registers its waiter *before* it sends anything, so an answer
//! can never arrive before someone waits for it (Go Pulse registered after
//! sending, and lost answers that beat the registration).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pulse_streams::{ReaderEvent, ReaderOptions, Start, Stream, StreamOptions};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::{Core, Outcome};
use crate::error::Result;
use crate::keys::PoolKeys;
use crate::wire;

/// How long a node's reply stream outlives the node: long enough for any
/// answer in flight, short enough that dead nodes leave nothing for long.
const REPLY_STREAM_TTL: Duration = Duration::from_secs(3600);

/// A worker's answer: its outcome and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) outcome: Outcome,
    pub(crate) message: String,
}

/// Callers waiting for answers, by request id.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
}

/// A registered waiter; dropping it unregisters it.
pub(crate) struct Waiter<'a> {
    waiters: &'a Waiters,
    pub(crate) request: String,
    answer: oneshot::Receiver<Answer>,
}

impl Waiters {
    pub(crate) fn register(&self, request: String) -> Waiter<'_> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(request.clone(), tx);
        Waiter { waiters: self, request, answer: rx }
    }

    fn deliver(&self, request: &str, answer: Answer) {
        if let Some(tx) = self.lock().remove(request) {
            let _ = tx.send(answer);
        }
    }

    /// Delivers the answers of reply stream entry `name`: one answer, or
    /// many in an `answers` entry (see [`wire::BATCHED`]). False when the
    /// entry is malformed; an answer nobody waits for any more is dropped.
    fn deliver_entry(&self, name: &str, payload: &[u8]) -> bool {
        if name == wire::ANSWERS {
            let Some(answers) = wire::decode_answers(payload) else { return false };
            let mut whole = true;
            for (outcome, request, message) in answers {
                match Outcome::parse(outcome) {
                    Some(outcome) => self.deliver(request, Answer { outcome, message: message.to_owned() }),
                    None => whole = false,
                }
            }
            return whole;
        }
        match (Outcome::parse(name), wire::decode_reply(payload)) {
            (Some(outcome), Some((request, message))) => {
                self.deliver(request, Answer { outcome, message: message.to_owned() });
                true
            }
            _ => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, oneshot::Sender<Answer>>> {
        // Held for one insert or remove, never across an await.
        self.map.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Waiter<'_> {
    /// The answer, or `None` after `timeout`.
    pub(crate) async fn wait(&mut self, timeout: Duration) -> Option<Answer> {
        self.wait_until(tokio::time::Instant::now() + timeout).await
    }

    /// The answer, or `None` once `deadline` passed. An answer that came
    /// already costs no timer: many waiters with one deadline are awaited
    /// one after the other cheaply.
    pub(crate) async fn wait_until(&mut self, deadline: tokio::time::Instant) -> Option<Answer> {
        tokio::time::timeout_at(deadline, &mut self.answer).await.ok().and_then(Result::ok)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.waiters.lock().remove(&self.request);
    }
}

/// The streams where workers answer this node's dispatches, by worker.
///
/// On a pool read by doorbells each worker answers a node's dispatches on
/// a stream of its own ([`PoolKeys::worker_replies_name`]): adding there
/// little else does, it picks the ids itself, so it knows the id before
/// each answer, which the ring must carry, and answers with plain commands
/// instead of a script (see `emits`). Stops, notifications and the
/// answers other workers give for a start that moved still come on the
/// node's stream, or on this one, through the script that rings.
#[derive(Debug, Default)]
pub(crate) struct WorkerReplies {
    /// The connection every reply stream of the node's group is read on:
    /// one beside the node's, so that the reads, a few per stream and
    /// second, stay off the connection dispatches and flushes take.
    conn: std::sync::OnceLock<pulse_redis::Shared>,
    streams: Mutex<HashMap<String, String>>,
    /// Held while a stream is created: one reader each.
    opening: tokio::sync::Mutex<()>,
}

impl WorkerReplies {
    fn get(&self, worker: &str) -> Option<String> {
        self.lock().get(worker).cloned()
    }

    /// Every stream, to remove or to add to.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, String>> {
        // Held for one lookup or update, never across an await.
        self.streams.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Core {
    /// Where `worker` answers a dispatch of this node: the node's reply
    /// stream, or on a pool read by doorbells the stream of the worker's
    /// answers to this node, created and read from its first dispatch
    /// (when it cannot be, the node's stream: the worker answers there
    /// through the script).
    pub(crate) async fn dispatch_replies(self: &Arc<Self>, worker: &str) -> String {
        if !self.doorbells || worker.is_empty() {
            return self.replies.clone();
        }
        if let Some(stream) = self.worker_replies.get(worker) {
            return stream;
        }
        // Boxed as a `dyn` future: it runs once per worker, and the
        // dispatch futures that await this one stay shallow enough for
        // the compiler's layout and `Send` queries.
        let opening: futures_util::future::BoxFuture<'_, Result<String>> = Box::pin(async move {
            let _opening = self.worker_replies.opening.lock().await;
            if let Some(stream) = self.worker_replies.get(worker) {
                return Ok(stream);
            }
            let stream = open(self, &PoolKeys::worker_replies_name(&self.id, worker), Some(worker)).await?;
            self.worker_replies.lock().insert(worker.to_owned(), stream.clone());
            Ok(stream)
        });
        // A dispatch never waits longer for the stream than for its answer.
        match tokio::time::timeout(self.options.reply_timeout, opening).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::warn!(worker, error = %error, "failed to open a worker's reply stream; using the node's");
                self.replies.clone()
            }
            Err(_) => {
                tracing::warn!(worker, "a worker's reply stream took too long to open; using the node's");
                self.replies.clone()
            }
        }
    }
}

/// Creates the node's reply stream and starts the task that reads it.
pub(crate) async fn start(core: &Arc<Core>) -> Result<()> {
    let conn = core.client.shared().await.map_err(core.redis_error("connect"))?;
    let _ = core.worker_replies.conn.set(conn);
    open(core, &PoolKeys::replies_name(&core.id), None).await.map(drop)
}

/// Creates reply stream `name` and starts the task that reads it until the
/// node closes, or for the stream of `worker`'s answers, until the worker
/// left the pool; returns the stream's key.
async fn open(core: &Arc<Core>, name: &str, worker: Option<&str>) -> Result<String> {
    let options =
        StreamOptions::default().hash_tag(&core.keys.tag).ttl(pulse_streams::Ttl::Sliding(REPLY_STREAM_TTL));
    let conn = core.worker_replies.conn.get().cloned().unwrap_or_else(|| core.conn.clone());
    let stream = Stream::open_on(&core.client, conn, name, options)?;
    // Workers answer with NOMKSTREAM, so answers to a node that is gone
    // create nothing: the stream must exist first.
    let hello = stream.add("hello", b"", None).await?;
    let options = ReaderOptions::default().start(Start::After(hello)).queue(65_536).doorbell(core.doorbells);
    let reader = stream.reader(options).await?;
    let key = pulse_streams::stream_key(&core.keys.tag, name);
    let mut subscription = reader.subscribe();
    let core = core.clone();
    let token = core.token.clone();
    let worker = worker.map(str::to_owned);
    let span = tracing::info_span!("pool.replies", node = %core.id, worker = worker.as_deref().unwrap_or(""));
    let stream_key = key.clone();
    core.tasks.clone().spawn(
        async move {
            let mut refresh = tokio::time::interval(REPLY_STREAM_TTL / 4);
            refresh.tick().await;
            // Once the worker has left the pool, nobody answers on its
            // stream any more: it goes as the workers' listing changes,
            // not an hour later by its TTL.
            let left = async {
                match &worker {
                    Some(worker) => {
                        if !core.workers.wait_until(Duration::MAX, |workers| workers.get(worker).is_none()).await {
                            // The listing closed with the worker in it:
                            // the node is closing, and removes its streams.
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(left);
            loop {
                tokio::select! {
                    biased;
                    () = token.cancelled() => break,
                    () = &mut left => {
                        if let Some(worker) = &worker {
                            core.worker_replies.lock().remove(worker);
                        }
                        let mut conn = core.conn.clone();
                        let _: redis::RedisResult<()> =
                            redis::cmd("DEL").arg(&stream_key).exec_async(&mut conn).await;
                        break;
                    }
                    _ = refresh.tick() => {
                        let mut conn = core.conn.clone();
                        let ttl = u64::try_from(REPLY_STREAM_TTL.as_millis()).unwrap_or(u64::MAX);
                        let _: redis::RedisResult<()> = redis::cmd("PEXPIRE")
                            .arg(&stream_key).arg(ttl).exec_async(&mut conn).await;
                    }
                    event = subscription.recv() => match event {
                        Some(ReaderEvent::Event(event)) => {
                            if !core.waiters.deliver_entry(&event.name, &event.payload) {
                                tracing::warn!(id = %event.id, name = %event.name, "skipped a malformed reply");
                            }
                        }
                        Some(ReaderEvent::Lagged { resume_after }) => {
                            // 65,536 answers queued means callers stopped
                            // waiting long ago; their waiters time out.
                            tracing::warn!(resume_after, "reply reader lagged; some answers were dropped");
                        }
                        None => break,
                    },
                }
            }
            reader.close().await;
        }
        .instrument(span),
    );
    Ok(key)
}
