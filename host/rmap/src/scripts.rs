//! The Lua scripts of every mutation, each prefixed with `lua/prelude.lua`
//! (helpers and the argument contract every script shares). One file per
//! operation under `lua/`, each starting with its `KEYS`/`ARGV` contract.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(&format!("{PRELUDE}\n{}", include_str!(concat!("../lua/", $file)))));
    };
}

script!(SET, "set.lua");
script!(SET_IF_NOT_EXISTS, "set_if_not_exists.lua");
script!(TEST_AND_SET, "test_and_set.lua");
script!(DELETE, "delete.lua");
script!(TEST_AND_DELETE, "test_and_delete.lua");
script!(RESET, "reset.lua");
script!(DESTROY, "destroy.lua");
script!(INCREMENT, "increment.lua");
script!(APPEND_VALUES, "append_values.lua");
script!(REMOVE_VALUES, "remove_values.lua");
