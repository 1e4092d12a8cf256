//! [`Ticker`]: a named interval shared by every node that creates it, each
//! tick firing on exactly one of them.
//!
//! There is no holder: every node with the ticker sleeps until the next due
//! time the shared entry names (in Redis time, returned as a delay, so the
//! nodes' clocks never matter), then asks `tick.lua`, which fires the tick
//! for the first caller and moves the due time on. A dead node just stops
//! asking; the others fire the next tick on time. A node only asks once its
//! previous tick was taken by its consumer, so a busy consumer leaves the
//! ticks to the other nodes instead of holding one it cannot deliver.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::Instrument as _;

use crate::core::Core;
use crate::error::{Error, Result};
use crate::keys;
use crate::node::Node;
use crate::scripts;

/// Wait before asking again after a Redis error.
const RETRY: Duration = Duration::from_secs(1);

/// One tick, fired on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// Which tick of the ticker this is, from 1: the count of its intervals
    /// since it was created.
    pub seq: u64,
    /// Ticks collapsed into this one because nobody asked while they were
    /// due (every node late, busy or down).
    pub missed: u64,
    /// How long after its due time the tick fired.
    pub late: Duration,
}

/// A named interval shared by the nodes of a pool (see the module docs).
/// Dropping it stops it on this node only; [`Ticker::stop`] stops it on
/// every node.
pub struct Ticker {
    name: String,
    ticks: mpsc::Receiver<Tick>,
    task: tokio::task::JoinHandle<()>,
    core: Arc<Core>,
}

/// What `tick.lua` answered.
enum Reply {
    Wait { delay: Duration },
    Fire { tick: Tick, delay: Duration },
    Stopped,
}

impl Ticker {
    pub(crate) async fn new(
        core: Arc<Core>,
        name: &str,
        interval: Duration,
        immediate: bool,
    ) -> Result<Self> {
        if !keys::is_name(name) {
            return Err(Error::InvalidTicker(name.to_owned()));
        }
        let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        if interval_ms == 0 {
            return Err(Error::ZeroInterval(name.to_owned()));
        }
        let first = ask(&core, name, interval_ms, true, immediate).await?;
        let (sender, ticks) = mpsc::channel(1);
        let span = tracing::info_span!("pool.ticker", pool = %core.keys.pool, ticker = %name);
        // On the node's tracker: it ends when the node closes.
        let task =
            core.tasks.spawn(run(core.clone(), name.to_owned(), interval_ms, first, sender).instrument(span));
        Ok(Self { name: name.to_owned(), ticks, task, core })
    }

    /// The ticker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next tick fired on this node; `None` once the ticker was stopped
    /// (here or on another node).
    ///
    /// # Cancel safety
    /// Cancel safe: a tick is fired (and its sequence number taken) only when
    /// returned.
    pub async fn tick(&mut self) -> Option<Tick> {
        self.ticks.recv().await
    }

    /// Stops the ticker on every node: its shared entry becomes `stopped`,
    /// and the other nodes' tickers end when they next ask. (Holding it
    /// again creates it anew.)
    ///
    /// # Errors
    /// [`Error::Redis`] when the entry could not be written.
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn stop(self) -> Result<()> {
        self.task.abort();
        let mut conn = self.core.conn.clone();
        redis::cmd("HSET")
            .arg(&self.core.keys.tickers)
            .arg(&self.name)
            .arg("stopped")
            .query_async::<()>(&mut conn)
            .await
            .map_err(self.core.redis_error("stop a ticker"))
    }
}

impl std::fmt::Debug for Ticker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticker")
            .field("pool", &self.core.keys.pool)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Holds ticker `name` of this pool with `interval`: each tick fires on
    /// exactly one of the nodes holding it, the first due one interval
    /// from its creation. Holding a ticker that exists with the same
    /// interval joins it; with another interval, replaces it everywhere.
    ///
    /// # Errors
    /// [`Error::InvalidTicker`], [`Error::ZeroInterval`], or Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: the ticker is written by its first tick, not here.
    pub async fn ticker(&self, name: &str, interval: Duration) -> Result<Ticker> {
        Ticker::new(self.core.clone(), name, interval, false).await
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ticker's task: sleep until due, ask, deliver.
async fn run(core: Arc<Core>, name: String, interval_ms: u64, first: Reply, sender: mpsc::Sender<Tick>) {
    let mut reply = Ok(first);
    loop {
        let delay = match reply {
            Ok(Reply::Stopped) => {
                tracing::debug!(pool = %core.keys.pool, ticker = %name, "ticker stopped");
                return;
            }
            Ok(Reply::Wait { delay }) => delay,
            Ok(Reply::Fire { tick, delay }) => {
                if tick.missed > 0 {
                    tracing::info!(pool = %core.keys.pool, ticker = %name, seq = tick.seq, missed = tick.missed, late = ?tick.late, "ticks missed");
                }
                // The channel had room when we asked and only this task
                // sends, so this does not block.
                if sender.send(tick).await.is_err() {
                    return;
                }
                delay
            }
            Err(error) => {
                tracing::warn!(pool = %core.keys.pool, ticker = %name, error = %error, "ticker could not reach Redis; retrying");
                RETRY.min(Duration::from_millis(interval_ms))
            }
        };
        // A millisecond more: Redis time may run a little behind ours.
        tokio::select! {
            () = core.token.cancelled() => return,
            () = tokio::time::sleep(delay + Duration::from_millis(1)) => {}
        }
        // Ask only once the last tick was taken: a busy consumer leaves the
        // ticks to the other nodes.
        let Ok(permit) = sender.reserve().await else { return };
        drop(permit);
        reply = ask(&core, &name, interval_ms, false, false).await;
    }
}

async fn ask(core: &Core, name: &str, interval_ms: u64, create: bool, immediate: bool) -> Result<Reply> {
    let mut conn = core.conn.clone();
    let answer: Vec<String> = scripts::TICK
        .key(&core.keys.tickers)
        .key(&core.keys.epoch)
        .arg(name)
        .arg(interval_ms)
        .arg(if create { "1" } else { "0" })
        .arg(if immediate { "1" } else { "0" })
        .invoke_async(&mut conn)
        .await
        .map_err(core.redis_error("advance a ticker"))?;
    let protocol = || crate::core::protocol("advance a ticker", &format!("{answer:?}"));
    let number =
        |i: usize| -> Result<u64> { answer.get(i).and_then(|v| v.parse().ok()).ok_or_else(protocol) };
    match answer.first().map(String::as_str) {
        Some("stopped") => Ok(Reply::Stopped),
        Some("wait") => Ok(Reply::Wait { delay: Duration::from_millis(number(1)?) }),
        Some("fire") => Ok(Reply::Fire {
            delay: Duration::from_millis(number(1)?),
            tick: Tick { seq: number(3)?, missed: number(4)?, late: Duration::from_millis(number(5)?) },
        }),
        _ => Err(protocol()),
    }
}
