//! Dispatches confirmed on replicas: with `confirm_replicas` set, the
//! dispatch scripts go on connections of their own with `WAIT` behind
//! them, and a job is only confirmed started once that many replicas
//! acknowledged its start.
//!
//! Why connections of their own: `WAIT` counts the writes of the
//! connection it is sent on, and blocks that connection until the
//! replicas answer or it times out; on the node's shared connection it
//! would hold up every lease renewal and answer behind it while a replica
//! is slow. Sixteen connections, so one slow acknowledgement does not hold
//! up every dispatch behind it either (with 4, 32 dispatchers confirmed
//! about half as many starts per second as without `WAIT`; with 16, about
//! two thirds); each is made when first needed (a
//! node that dispatches nothing opens none) and again after a failure.
//! The slot groups of a pool share them: on a cluster each carries a
//! group's scripts and their `WAIT` to that group's master.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::Value;

use crate::options::NodeOptions;

/// Connections a node keeps for confirmed dispatches.
const CONNECTIONS: usize = 16;

pub(super) struct Confirm {
    redis: pulse_redis::Redis,
    replicas: u32,
    timeout: Duration,
    /// Each made when first needed, and again after it failed.
    conns: Vec<tokio::sync::Mutex<Option<pulse_redis::Dedicated>>>,
    next: AtomicUsize,
}

/// The replies of a pipeline of dispatch scripts, and whether the
/// replicas hold what they wrote.
pub(super) struct Sent {
    pub(super) replies: Vec<redis::RedisResult<Value>>,
    pub(super) held: bool,
}

impl Confirm {
    /// What confirms dispatches for `options.confirm_replicas`, or none
    /// when it is 0.
    pub(super) fn new(redis: &pulse_redis::Redis, options: &NodeOptions) -> Option<Self> {
        (options.confirm_replicas > 0).then(|| Self {
            redis: redis.clone(),
            replicas: options.confirm_replicas,
            timeout: options.reply_timeout.max(Duration::from_millis(1)),
            conns: (0..CONNECTIONS).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        })
    }

    /// Sends `pipe` (dispatch scripts, errors ignored) with `WAIT` behind
    /// it on one connection: each script's reply, and whether
    /// `confirm_replicas` replicas acknowledged them within `reply_timeout`.
    pub(super) async fn send(&self, mut pipe: redis::Pipeline) -> redis::RedisResult<Sent> {
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        pipe.cmd("WAIT").arg(self.replicas).arg(timeout_ms);
        let slot = &self.conns[self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len()];
        let mut slot = slot.lock().await;
        let conn = match &mut *slot {
            Some(conn) => conn,
            // Answers may take the whole `WAIT`, and a little more.
            empty => empty.insert(self.redis.dedicated(self.timeout + Duration::from_secs(1)).await?),
        };
        let mut replies: Vec<redis::RedisResult<Value>> = match pipe.query_async(conn).await {
            Ok(replies) => replies,
            Err(error) => {
                *slot = None;
                return Err(error);
            }
        };
        let acknowledged = match replies.pop() {
            Some(Ok(Value::Int(n))) => u64::try_from(n).unwrap_or(0),
            _ => 0,
        };
        Ok(Sent { replies, held: acknowledged >= u64::from(self.replicas) })
    }
}
