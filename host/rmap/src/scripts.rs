//! The Lua scripts of every mutation, each after the functions it uses of
//! `lua/library.lua` (the change format, shared with other crates'
//! scripts: [`assemble`]) and `lua/prelude.lua` (the argument contract every
//! script here shares). One file per operation under `lua/`, each starting
//! with its `KEYS`/`ARGV` contract.

use std::collections::HashSet;
use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

/// Lua functions that change a map in the format its replicas apply:
/// `rmap_set(map, key, value)`, `rmap_set_many(map, {key, value, ...})`,
/// `rmap_del(map, key)`, `rmap_clear(map)`, `rmap_entries(map)`,
/// with `map = {hash = ..., channel = ..., epoch = ...}` (see
/// [`crate::Map::redis_key`] and [`crate::Map::channel`]), and the netstring
/// helpers `ns(s)` and `netstrings(value)`. A script that must change a map
/// atomically with keys of its own is made with [`assemble`].
pub const SCRIPT_LIBRARY: &str = include_str!("../lua/library.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(&assemble(
                &[SCRIPT_LIBRARY],
                &format!("{PRELUDE}\n{}", include_str!(concat!("../lua/", $file))),
            ))
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

/// A script: `body` after the definitions of `libraries` that it uses,
/// directly or through another definition, in their order. A library is
/// Lua made of top-level statements, most of them `local function f(…) …
/// end`; a function nothing uses is left out, every other statement is
/// kept. Redis runs a script's whole text on every call, so each function
/// left in would be made again on each call for nothing (a sequential
/// `echo` job's two scripts took about 4 µs less of Redis's time without
/// them: BENCHMARKS.md).
pub fn assemble(libraries: &[&str], body: &str) -> String {
    let blocks: Vec<Block<'_>> = libraries.iter().flat_map(|library| blocks(library)).collect();
    let mut used: HashSet<&str> = words(body).collect();
    let mut keep = vec![false; blocks.len()];
    // A local function can only use what is defined before it: one pass
    // from the last definition to the first.
    for (i, block) in blocks.iter().enumerate().rev() {
        if block.function.is_none_or(|name| used.contains(name)) {
            keep[i] = true;
            used.extend(words(block.text));
        }
    }
    let mut script = String::new();
    for (block, _) in blocks.iter().zip(&keep).filter(|(_, keep)| **keep) {
        script.push_str(block.text);
    }
    script.push_str(body);
    script
}

/// A top-level statement of a library, with the comments above it: the
/// name of the local function it defines, if it does.
struct Block<'a> {
    function: Option<&'a str>,
    text: &'a str,
}

/// The top-level statements of `library`. Each starts at a line in column
/// 0 that begins with a letter and is not a comment or a closing `end`, or
/// at the comment lines just above it; the library's opening comments are
/// left out. So a statement's inner lines must be indented, as they are in
/// this project's Lua: a library that breaks this makes scripts that fail
/// to load, which the first test to run one shows.
fn blocks(library: &str) -> Vec<Block<'_>> {
    let mut starts = Vec::new();
    // Where the comment lines just above the current line began.
    let mut comments: Option<usize> = None;
    let mut at = 0;
    for line in library.split_inclusive('\n') {
        if line.starts_with("--") {
            comments.get_or_insert(at);
        } else if line.starts_with(|c: char| c.is_ascii_alphabetic()) && words(line).next() != Some("end") {
            starts.push(comments.unwrap_or(at));
            comments = None;
        } else {
            comments = None;
        }
        at += line.len();
    }
    starts
        .iter()
        .enumerate()
        .map(|(i, &start)| {
            let text = &library[start..starts.get(i + 1).copied().unwrap_or(library.len())];
            let statement = text.lines().find(|line| !line.starts_with("--")).unwrap_or_default();
            let function = statement.strip_prefix("local function ").and_then(|rest| words(rest).next());
            Block { function, text }
        })
        .collect()
}

/// The identifiers (and numbers) of Lua text.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|word| !word.is_empty())
}

#[cfg(test)]
mod tests {
    use super::assemble;

    const LIBRARY: &str = "-- The library.\n\
        \n\
        local cache = {}\n\
        -- Used by b.\n\
        local function a(x)\n  return x\nend\n\
        \n\
        -- Uses a.\n\
        local function b(x)\n  return a(x) .. ','\nend\n\
        local function unused()\n  return cache\nend\n";

    #[test]
    fn a_script_gets_what_it_uses_and_what_that_uses_in_order() {
        let script = assemble(&[LIBRARY], "return b('x')\n");
        assert_eq!(
            script,
            "local cache = {}\n-- Used by b.\nlocal function a(x)\n  return x\nend\n\n\
             -- Uses a.\nlocal function b(x)\n  return a(x) .. ','\nend\nreturn b('x')\n"
        );
    }

    #[test]
    fn functions_nothing_uses_are_left_out_and_other_statements_kept() {
        assert_eq!(assemble(&[LIBRARY], "return 1\n"), "local cache = {}\nreturn 1\n");
        // A name in a later library's used function counts as a use.
        let script = assemble(&[LIBRARY, "local function c()\n  return unused()\nend\n"], "return c()\n");
        assert!(script.contains("local function unused()"), "{script}");
        assert!(!script.contains("local function a("), "{script}");
    }
}
