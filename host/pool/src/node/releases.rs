//! The releases a pool refuses. A host whose upgrade gate finds a new
//! release failing the jobs it inherits undoes it and records it here, by
//! digest, with the reason: every host of the pool then refuses that file
//! without trying it, until an operator clears the record. Pool-wide, in
//! group 0's keys (one small hash, read when a release is loaded).

use super::{Node, PoolView};
use crate::error::Result;
use crate::keys::PoolKeys;

/// A release the pool refuses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RefusedRelease {
    /// `sha256:<hex>` of the component's file.
    pub digest: String,
    /// Why, as the host that refused it said (host, figures, first error).
    pub reason: String,
}

impl Node {
    /// Records release `digest` as refused by the pool, for `reason`.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one write, made or not.
    pub async fn refuse_release(&self, digest: &str, reason: &str) -> Result<()> {
        let core = &self.core;
        let () = redis::cmd("HSET")
            .arg(&core.keys.refused)
            .arg(digest)
            .arg(reason)
            .query_async(&mut core.conn.clone())
            .await
            .map_err(core.redis_error("record a refused release"))?;
        Ok(())
    }

    /// The releases the pool refuses, by digest.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn refused_releases(&self) -> Result<Vec<RefusedRelease>> {
        read_all(&self.core.conn, &self.core.keys).await
    }

    /// Why the pool refuses release `digest`; `None` when it does not.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn refused_release(&self, digest: &str) -> Result<Option<String>> {
        let core = &self.core;
        redis::cmd("HGET")
            .arg(&core.keys.refused)
            .arg(digest)
            .query_async(&mut core.conn.clone())
            .await
            .map_err(core.redis_error("read the refused releases"))
    }
}

async fn read_all(conn: &pulse_redis::Shared, keys: &PoolKeys) -> Result<Vec<RefusedRelease>> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&keys.refused)
        .query_async(&mut conn.clone())
        .await
        .map_err(keys.redis_error("read the refused releases"))?;
    let mut refused: Vec<RefusedRelease> =
        all.into_iter().map(|(digest, reason)| RefusedRelease { digest, reason }).collect();
    refused.sort_by(|a, b| a.digest.cmp(&b.digest));
    Ok(refused)
}

impl PoolView {
    /// The releases the pool refuses, by digest.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn refused_releases(&self) -> Result<Vec<RefusedRelease>> {
        read_all(&self.conn, self.keys()).await
    }

    /// Clears the pool's refusal of release `digest`, or of every release
    /// (`None`): hosts bringing it try it again. Returns whether the pool
    /// refused any such release.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one write, made or not.
    pub async fn clear_refused(&self, digest: Option<&str>) -> Result<bool> {
        let keys: &PoolKeys = self.keys();
        let mut cmd = redis::cmd(if digest.is_some() { "HDEL" } else { "DEL" });
        cmd.arg(&keys.refused).arg(digest);
        let cleared: usize = cmd
            .query_async(&mut self.conn.clone())
            .await
            .map_err(keys.redis_error("clear a refused release"))?;
        Ok(cleared > 0)
    }
}
