//! The pool's Lua scripts (`lua/`), each prefixed with the replicated map
//! library ([`pulse_rmap::SCRIPT_LIBRARY`]: the slot table and workers map
//! change in the same step as the jobs) and `lua/prelude.lua` (the
//! ownership format and helpers) and opening with its `KEYS`/`ARGV`
//! contract and why it must be atomic.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(&format!(
                "{}\n{PRELUDE}\n{}",
                pulse_rmap::SCRIPT_LIBRARY,
                include_str!(concat!("../lua/", $file))
            ))
        });
    };
}

script!(DISPATCH, "dispatch.lua");
script!(ASSIGN, "assign.lua");
script!(ROUTE, "route.lua");
script!(FINISH, "finish.lua");
script!(FAIL, "fail.lua");
script!(SAVE_STATE, "save_state.lua");
script!(EMIT, "emit.lua");
script!(RESET_FAILED, "reset_failed.lua");
script!(REQUEUE, "requeue.lua");
script!(MARK_MOVING, "mark_moving.lua");
script!(JOIN, "join.lua");
script!(RELEASE_SLOT, "release_slot.lua");
script!(RENEW, "renew.lua");
script!(EVICT, "evict.lua");
script!(REASSERT, "reassert.lua");
script!(TICK, "tick.lua");
script!(COUNTS, "counts.lua");
