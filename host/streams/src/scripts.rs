//! The Lua scripts, one file each under `lua/`, each opening with its
//! `KEYS`/`ARGV` contract and why it must be atomic.

use std::sync::LazyLock;

use redis::Script;

/// Adds an event, making room only from what every group acknowledged.
pub(crate) static ADD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/add.lua")));
/// Records a consumer's heartbeat on Redis time.
pub(crate) static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/heartbeat.lua")));
/// Removes dead consumers that hold nothing.
pub(crate) static REAP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/reap.lua")));
/// Removes a closing consumer that holds nothing.
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/leave.lua")));
