//! A release announced for the whole pool (`pulse-host rollout start`).
//! Every host of the pool follows the record: one at a time, each takes
//! the turn, replaces its workers by the release (each judged by its
//! upgrade gate) and gives the turn back with its outcome (`rollout.lua`).
//! The record is pool-wide, in group 0's keys.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Node, PoolView};
use crate::error::Result;
use crate::keys::PoolKeys;
use crate::scripts;

/// Where a pool-wide rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutState {
    /// Hosts take the release in turn.
    Running,
    /// No host takes a turn (one in its turn finishes it).
    Paused,
    /// Hosts running the release go back to the one they ran before.
    Undoing,
    /// A host's upgrade gate refused the release: no host takes it.
    Halted,
}

impl RolloutState {
    /// Its one string form, in Redis and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Paused => "paused",
            RolloutState::Undoing => "undoing",
            RolloutState::Halted => "halted",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [RolloutState::Running, RolloutState::Paused, RolloutState::Undoing, RolloutState::Halted]
            .into_iter()
            .find(|state| state.as_str() == text)
    }
}

/// A release announced for the whole pool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rollout {
    /// `sha256:<hex>` of the component's file.
    pub digest: String,
    /// Its `version` (empty when not named).
    pub version: String,
    /// Where every host reads the file.
    pub path: String,
    /// Where it is.
    pub state: RolloutState,
    /// Why it halted (empty otherwise).
    pub reason: String,
    /// The node whose turn it is, if any.
    pub turn: Option<String>,
    /// Each host's outcome, by node: `done`, `undone` or `halt`.
    pub hosts: BTreeMap<String, String>,
}

/// What a host says when it gives its turn back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutOutcome {
    /// Its workers run the release.
    Done,
    /// Its workers went back to the release they ran before.
    Undone,
    /// Its upgrade gate refused the release, for this reason: the rollout
    /// halts.
    Halted(String),
    /// It gives the turn back without an outcome (it leaves).
    Yielded,
}

async fn read(conn: &pulse_redis::Shared, keys: &PoolKeys) -> Result<Option<Rollout>> {
    let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(&keys.rollout)
        .query_async(&mut conn.clone())
        .await
        .map_err(keys.redis_error("read the pool's rollout"))?;
    let Some(digest) = fields.get("digest") else { return Ok(None) };
    let field = |name: &str| fields.get(name).cloned().unwrap_or_default();
    Ok(Some(Rollout {
        digest: digest.clone(),
        version: field("version"),
        path: field("path"),
        state: RolloutState::parse(&field("state")).unwrap_or(RolloutState::Halted),
        reason: field("reason"),
        turn: fields.get("turn").cloned(),
        hosts: fields
            .iter()
            .filter_map(|(name, outcome)| Some((name.strip_prefix("host:")?.to_owned(), outcome.clone())))
            .collect(),
    }))
}

impl Node {
    /// The release announced for the pool, if any.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn rollout(&self) -> Result<Option<Rollout>> {
        read(&self.core.conn, &self.core.keys).await
    }

    /// Takes the turn of the rollout of release `digest` for this node,
    /// for at most `ttl`; whether it got it (not while another node holds
    /// it, or the rollout does not run).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one script, run or not.
    pub async fn take_rollout_turn(&self, digest: &str, ttl: Duration) -> Result<bool> {
        let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).to_string();
        Ok(self.rollout_step("take", digest, &ttl).await? == "taken")
    }

    /// Gives the turn of the rollout of release `digest` back, with this
    /// node's outcome.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one script, run or not.
    pub async fn report_rollout(&self, digest: &str, outcome: &RolloutOutcome) -> Result<()> {
        let (op, arg) = match outcome {
            RolloutOutcome::Done => ("done", ""),
            RolloutOutcome::Undone => ("undone", ""),
            RolloutOutcome::Halted(reason) => ("halt", reason.as_str()),
            RolloutOutcome::Yielded => ("yield", ""),
        };
        self.rollout_step(op, digest, arg).await.map(drop)
    }

    async fn rollout_step(&self, op: &str, digest: &str, arg: &str) -> Result<String> {
        let core = &self.core;
        let mut cmd = scripts::evalsha(&scripts::ROLLOUT, std::slice::from_ref(&core.keys.rollout));
        cmd.arg(op).arg(self.id()).arg(digest).arg(arg);
        scripts::query(&scripts::ROLLOUT, &cmd, &mut core.conn.clone())
            .await
            .map_err(core.redis_error("step the pool's rollout"))
    }
}

impl PoolView {
    /// The release announced for the pool, if any.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn rollout(&self) -> Result<Option<Rollout>> {
        read(&self.conn, self.keys()).await
    }

    /// Announces release `digest` (`version`, read by every host at
    /// `path`) for the whole pool, in place of any rollout before.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one transaction, made or not.
    pub async fn announce_rollout(&self, digest: &str, version: &str, path: &str) -> Result<()> {
        let keys = self.keys();
        let () = redis::pipe()
            .atomic()
            .del(&keys.rollout)
            .ignore()
            .hset_multiple(
                &keys.rollout,
                &[("digest", digest), ("version", version), ("path", path), ("state", "running")],
            )
            .ignore()
            .query_async(&mut self.conn.clone())
            .await
            .map_err(keys.redis_error("announce a rollout"))?;
        Ok(())
    }

    /// Sets the state of the pool's rollout (pause, resume, undo);
    /// whether there was one.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one write, made or not.
    pub async fn set_rollout_state(&self, state: RolloutState) -> Result<bool> {
        let keys = self.keys();
        let exists: bool = redis::cmd("HEXISTS")
            .arg(&keys.rollout)
            .arg("digest")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(keys.redis_error("read the pool's rollout"))?;
        if exists {
            let () = redis::cmd("HSET")
                .arg(&keys.rollout)
                .arg("state")
                .arg(state.as_str())
                .query_async(&mut self.conn.clone())
                .await
                .map_err(keys.redis_error("change the pool's rollout"))?;
        }
        Ok(exists)
    }
}
