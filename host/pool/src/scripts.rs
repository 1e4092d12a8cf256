//! The pool's Lua scripts (`lua/`), each after the functions it uses of the
//! replicated map library ([`pulse_rmap::SCRIPT_LIBRARY`]: the slot table
//! and workers map change in the same step as the jobs) and of
//! `lua/prelude.lua` (the ownership format and helpers), put together by
//! [`pulse_rmap::assemble`], and opening with its `KEYS`/`ARGV` contract
//! and why it must be atomic.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(&pulse_rmap::assemble(
                &[pulse_rmap::SCRIPT_LIBRARY, PRELUDE],
                include_str!(concat!("../lua/", $file)),
            ))
        });
    };
}

script!(DISPATCH, "dispatch.lua");
script!(ASSIGN, "assign.lua");
script!(ROUTE, "route.lua");
script!(FINISH, "finish.lua");
script!(FAIL, "fail.lua");
script!(WRITE, "write.lua");
script!(RESET_FAILED, "reset_failed.lua");
script!(REQUEUE, "requeue.lua");
script!(MARK_MOVING, "mark_moving.lua");
script!(JOIN, "join.lua");
script!(RELEASE_SLOT, "release_slot.lua");
script!(RENEW, "renew.lua");
script!(EXPIRED, "expired.lua");
script!(EVICT, "evict.lua");
script!(REASSERT, "reassert.lua");
script!(TICK, "tick.lua");
script!(COUNTS, "counts.lua");
script!(ROLLOUT, "rollout.lua");

/// `script` as a command of its own (`EVALSHA`), with `keys`; the caller
/// adds the arguments. For a pipeline of many calls: sent with
/// [`query`], or in a pipeline whose `NOSCRIPT` answers are sent again
/// after [`load`].
pub(crate) fn evalsha(script: &Script, keys: &[String]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}

/// Whether `error` says the server does not know the script (it restarted
/// or its scripts were flushed): load it and send again.
pub(crate) fn is_unknown_script(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Loads `script` into the server's cache.
pub(crate) async fn load(
    script: &Script,
    conn: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<()> {
    script.prepare_invoke().load_async(conn).await.map(drop)
}

/// Sends `cmd`, an [`evalsha`] of `script`, loading the script first if
/// the server does not know it.
pub(crate) async fn query<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &redis::Cmd,
    conn: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(error) if is_unknown_script(&error) => {
            load(script, conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}
