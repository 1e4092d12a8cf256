//! The node's reply stream, where workers answer dispatches, stops and
//! notifications, and the waiters that match answers to callers.
//!
//! A caller registers its waiter *before* it sends anything, so an answer
//! can never arrive before someone waits for it (Go Pulse registered after
//! sending, and lost answers that beat the registration).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pulse_streams::{ReaderEvent, ReaderOptions, Start, Stream, StreamOptions};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
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
                match Outcome::parse(&outcome) {
                    Some(outcome) => self.deliver(&request, Answer { outcome, message }),
                    None => whole = false,
                }
            }
            return whole;
        }
        match (Outcome::parse(name), wire::decode_reply(payload)) {
            (Some(outcome), Some((request, message))) => {
                self.deliver(&request, Answer { outcome, message });
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

/// Creates the node's reply stream and starts the task that reads it.
pub(crate) async fn start(core: &Arc<Core>, token: &CancellationToken) -> Result<()> {
    let options =
        StreamOptions::default().hash_tag(&core.keys.tag).ttl(pulse_streams::Ttl::Sliding(REPLY_STREAM_TTL));
    let stream = Stream::open(&core.client, &PoolKeys::replies_name(&core.id), options).await?;
    // Workers answer with NOMKSTREAM, so answers to a node that is gone
    // create nothing: the stream must exist first.
    let hello = stream.add("hello", b"", None).await?;
    let options = ReaderOptions::default().start(Start::After(hello)).queue(65_536).doorbell(core.doorbells);
    let reader = stream.reader(options).await?;
    let mut subscription = reader.subscribe();
    let core = core.clone();
    let token = token.clone();
    let span = tracing::info_span!("pool.replies", node = %core.id);
    core.tasks.clone().spawn(
        async move {
            let mut refresh = tokio::time::interval(REPLY_STREAM_TTL / 4);
            loop {
                tokio::select! {
                    biased;
                    () = token.cancelled() => break,
                    _ = refresh.tick() => {
                        let mut conn = core.conn.clone();
                        let ttl = u64::try_from(REPLY_STREAM_TTL.as_millis()).unwrap_or(u64::MAX);
                        let _: redis::RedisResult<()> = redis::cmd("PEXPIRE")
                            .arg(&core.replies).arg(ttl).exec_async(&mut conn).await;
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
    Ok(())
}
