//! [`Map`]'s writes: each one script that changes the hash, bumps its
//! revision and publishes the change in one atomic step.

use std::time::Duration;

use redis::{FromRedisValue, Script};

use super::{Map, Swap, Ttl};
use crate::codec::decode_list;
use crate::error::{Error, Result};
use crate::keys::validate_key;
use crate::replica::Position;
use crate::scripts;

impl Map {
    /// Sets `key` to `value`; returns the previous value.
    ///
    /// # Errors
    /// [`Error::InvalidKey`], [`Error::Closed`], or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn set(&self, key: &str, value: &str) -> Result<Option<String>> {
        validate_key(key)?;
        let (_, _, previous): (u64, String, Option<String>) =
            self.run("set", &scripts::SET, &[key, value]).await?;
        Ok(previous)
    }

    /// Sets every `(key, value)` of `entries` as one change: one revision,
    /// one message, one event ([`crate::MapEvent::SetMany`]) for subscribers.
    /// Nothing happens when `entries` is empty.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn set_many(&self, entries: &[(&str, &str)]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut args = Vec::with_capacity(entries.len() * 2);
        for (key, value) in entries {
            validate_key(key)?;
            args.extend([*key, *value]);
        }
        let _: (u64, String) = self.run("set_many", &scripts::SET_MANY, &args).await?;
        Ok(())
    }

    /// Sets `key` to `value` and returns once the local replica shows this
    /// write (or a later state), or fails after `timeout`.
    ///
    /// # Errors
    /// As [`Map::set`], and [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn set_and_wait(&self, key: &str, value: &str, timeout: Duration) -> Result<Option<String>> {
        validate_key(key)?;
        let snapshots_before = self.shared.position.borrow().snapshots;
        let (rev, epoch, previous): (u64, String, Option<String>) =
            self.run("set", &scripts::SET, &[key, value]).await?;
        let mut position = self.shared.position.subscribe();
        let reached = |p: &Position| {
            (p.epoch.as_deref() == Some(epoch.as_str()) && p.rev >= rev)
                // The map was recreated since: a snapshot taken after the
                // write reflects it or what replaced it.
                || (p.epoch.as_deref() != Some(epoch.as_str()) && p.snapshots > snapshots_before)
        };
        match tokio::time::timeout(timeout, position.wait_for(reached)).await {
            Ok(Ok(_)) => Ok(previous),
            Ok(Err(_closed)) => Err(Error::Closed(self.shared.name.clone())),
            Err(_elapsed) => Err(Error::Timeout { map: self.shared.name.clone(), timeout }),
        }
    }

    /// Sets `key` only if it is absent; returns whether it did.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn set_if_not_exists(&self, key: &str, value: &str) -> Result<bool> {
        validate_key(key)?;
        let (rev, _): (u64, String) =
            self.run("set_if_not_exists", &scripts::SET_IF_NOT_EXISTS, &[key, value]).await?;
        Ok(rev > 0)
    }

    /// Sets `key` to `value` only if it holds `test` (a missing key never
    /// matches).
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn test_and_set(&self, key: &str, test: &str, value: &str) -> Result<Swap> {
        validate_key(key)?;
        let (rev, _, previous): (u64, String, Option<String>) =
            self.run("test_and_set", &scripts::TEST_AND_SET, &[key, test, value]).await?;
        Ok(Swap { previous, done: rev > 0 })
    }

    /// Deletes `key`; returns the value it held.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn delete(&self, key: &str) -> Result<Option<String>> {
        validate_key(key)?;
        let (_, _, previous): (u64, String, Option<String>) =
            self.run("delete", &scripts::DELETE, &[key]).await?;
        Ok(previous)
    }

    /// Deletes `key` only if it holds `test`.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn test_and_delete(&self, key: &str, test: &str) -> Result<Swap> {
        validate_key(key)?;
        let (rev, _, previous): (u64, String, Option<String>) =
            self.run("test_and_delete", &scripts::TEST_AND_DELETE, &[key, test]).await?;
        Ok(Swap { previous, done: rev > 0 })
    }

    /// Removes every key if each listed key holds its test value (a missing
    /// key never matches); returns whether it did. With no pairs, always.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn test_and_reset(&self, tests: &[(&str, &str)]) -> Result<bool> {
        let mut args = Vec::with_capacity(tests.len() * 2);
        for (key, test) in tests {
            validate_key(key)?;
            args.extend([*key, *test]);
        }
        let (rev, _): (u64, String) = self.run("test_and_reset", &scripts::RESET, &args).await?;
        Ok(rev > 0)
    }

    /// Removes every key.
    ///
    /// # Errors
    /// [`Error::Closed`] or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn reset(&self) -> Result<()> {
        let _: (u64, String) = self.run("reset", &scripts::RESET, &[]).await?;
        Ok(())
    }

    /// Deletes the map from Redis; every replica empties. A later write
    /// creates it anew.
    ///
    /// # Errors
    /// [`Error::Closed`] or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn destroy(&self) -> Result<()> {
        let _: (u64, String) = self.run("destroy", &scripts::DESTROY, &[]).await?;
        Ok(())
    }

    /// Adds `delta` to the integer at `key` (absent counts as 0); returns
    /// the new value.
    ///
    /// # Errors
    /// As [`Map::set`]; [`Error::Redis`] when the value is not an integer.
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn increment(&self, key: &str, delta: i64) -> Result<i64> {
        validate_key(key)?;
        let delta = delta.to_string();
        let (_, _, value): (u64, String, i64) =
            self.run("increment", &scripts::INCREMENT, &[key, &delta]).await?;
        Ok(value)
    }

    /// Appends `items` to the list at `key`; returns the new list.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn append_values(&self, key: &str, items: &[&str]) -> Result<Vec<String>> {
        self.append(key, items, false).await
    }

    /// Appends the `items` not yet in the list at `key` (once each);
    /// returns the new list.
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn append_unique_values(&self, key: &str, items: &[&str]) -> Result<Vec<String>> {
        self.append(key, items, true).await
    }

    /// Removes every occurrence of `items` from the list at `key`; returns
    /// what remains, or `None` when the key is absent or the list became
    /// empty (the key is then deleted).
    ///
    /// # Errors
    /// As [`Map::set`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Map::set`]).
    pub async fn remove_values(&self, key: &str, items: &[&str]) -> Result<Option<Vec<String>>> {
        validate_key(key)?;
        let mut args = vec![key];
        args.extend_from_slice(items);
        let (_, _, value): (u64, String, Option<String>) =
            self.run("remove_values", &scripts::REMOVE_VALUES, &args).await?;
        Ok(value.and_then(|v| decode_list(&v)))
    }

    async fn append(&self, key: &str, items: &[&str], unique: bool) -> Result<Vec<String>> {
        validate_key(key)?;
        let mut args = vec![if unique { "1" } else { "0" }, key];
        args.extend_from_slice(items);
        let (_, _, value): (u64, String, Option<String>) =
            self.run("append_values", &scripts::APPEND_VALUES, &args).await?;
        Ok(value.and_then(|v| decode_list(&v)).unwrap_or_default())
    }

    /// Runs a mutation script with the arguments every script shares.
    async fn run<T: FromRedisValue>(&self, op: &'static str, script: &Script, args: &[&str]) -> Result<T> {
        if self.handle.token.is_cancelled() {
            return Err(Error::Closed(self.shared.name.clone()));
        }
        let (ttl_ms, mode) = match self.shared.ttl {
            None => (0, "absolute"),
            Some(Ttl::Absolute(ttl)) => (ttl.as_millis().max(1), "absolute"),
            Some(Ttl::Sliding(ttl)) => (ttl.as_millis().max(1), "sliding"),
        };
        let mut invocation = script.key(&self.shared.keys.hash);
        invocation
            .arg(&self.shared.keys.channel)
            .arg(format!("{:016x}", fastrand::u64(..)))
            .arg(ttl_ms.to_string())
            .arg(mode);
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.shared.conn.clone();
        invocation.invoke_async(&mut conn).await.map_err(|source| Error::Redis {
            op,
            map: self.shared.name.clone(),
            source,
        })
    }
}
