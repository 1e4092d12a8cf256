//! The Lua scripts of every mutation, each prefixed with `lua/library.lua`
//! (the change format, shared with other crates' scripts) and
//! `lua/prelude.lua` (the argument contract every script here shares). One file per
//! operation under `lua/`, each starting with its `KEYS`/`ARGV` contract.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

/// Lua functions that change a map in the format its replicas apply:
/// `rmap_set(map, key, value)`, `rmap_set_many(map, {key, value, ...})`,
/// `rmap_del(map, key)`, `rmap_clear(map)`, `rmap_entries(map)`,
/// with `map = {hash = ..., channel = ..., epoch = ...}` (see
/// [`crate::Map::redis_key`] and [`crate::Map::channel`]), and the netstring
/// helpers `ns(s)` and `netstrings(value)`. Prepend it to a script that
/// must change a map atomically with keys of its own.
pub const SCRIPT_LIBRARY: &str = include_str!("../lua/library.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(&format!("{SCRIPT_LIBRARY}\n{PRELUDE}\n{}", include_str!(concat!("../lua/", $file))))
        });
    };
}

script!(SET, "set.lua");
script!(SET_MANY, "set_many.lua");
script!(SET_IF_NOT_EXISTS, "set_if_not_exists.lua");
script!(TEST_AND_SET, "test_and_set.lua");
script!(DELETE, "delete.lua");
script!(TEST_AND_DELETE, "test_and_delete.lua");
script!(RESET, "reset.lua");
script!(DESTROY, "destroy.lua");
script!(INCREMENT, "increment.lua");
script!(APPEND_VALUES, "append_values.lua");
script!(REMOVE_VALUES, "remove_values.lua");
