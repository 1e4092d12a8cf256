//! The commands and options that docs/cli.md and the README show are the
//! ones the binary's `--help` lists: a command or flag added, renamed or
//! removed on one side fails here until the other follows.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The `--help` text of `pulse-host` with `args` before it.
fn help(args: &[&str]) -> String {
    let output = Command::new(crate::binary()).args(args).arg("--help").output().unwrap();
    assert!(output.status.success(), "{args:?} --help failed: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The lines of `section` (`Commands:`, `Options:`) of a help text.
fn section<'a>(help: &'a str, section: &str) -> Vec<&'a str> {
    help.lines().skip_while(|line| *line != section).skip(1).take_while(|line| !line.is_empty()).collect()
}

/// The `--flags` a help text's `Options:` lists (the first on each line;
/// `--help` and the program's `--version` left out, but an option named
/// `--version` that takes a value kept).
fn options(help: &str) -> BTreeSet<String> {
    section(help, "Options:")
        .iter()
        .filter_map(|line| {
            let flag = line.split_whitespace().find(|word| word.starts_with("--"))?;
            let takes_value = line.contains('<');
            Some(flag.trim_end_matches(',').to_owned())
                .filter(|flag| flag != "--help" && (flag != "--version" || takes_value))
        })
        .collect()
}

/// The `--flags` written in `text`.
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// Every command of the binary with its own options, from `--help`.
fn commands() -> BTreeMap<String, BTreeSet<String>> {
    let top = help(&[]);
    let names: Vec<String> = section(&top, "Commands:")
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() > 10, "the commands of `pulse-host --help`: {top}");
    let global = options(&top);
    names
        .into_iter()
        .map(|name| {
            let own = options(&help(&[&name])).difference(&global).cloned().collect();
            (name, own)
        })
        .collect()
}

#[test]
fn docs_cli_md_shows_every_command_with_exactly_the_options_of_its_help() {
    let doc = include_str!("../../../../docs/cli.md");
    let top = help(&[]);
    let synopsis = doc.lines().find(|line| line.starts_with("`pulse-host [")).expect("the synopsis line");
    assert_eq!(flags(synopsis), options(&top), "docs/cli.md's synopsis against `pulse-host --help`");
    let table = doc.split("## Commands").nth(1).and_then(|rest| rest.split("\n## ").next()).unwrap();
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for cell in table.lines().filter_map(|line| line.strip_prefix("| `")?.split("` |").next()) {
        let name = cell.split_whitespace().next().unwrap().to_owned();
        documented.entry(name).or_default().extend(flags(cell));
    }
    assert_eq!(documented, commands(), "docs/cli.md's commands table (left) against each command's --help");
}

#[test]
fn the_readme_shows_only_commands_and_options_the_binary_has() {
    let readme = include_str!("../../../../README.md");
    let block = readme.split("## Running it\n\n```sh\n").nth(1).and_then(|rest| rest.split("```").next());
    let commands = commands();
    let mut shown = BTreeSet::new();
    for line in block.expect("the README's `Running it` block").lines() {
        let line = line.split('#').next().unwrap();
        let words = line.strip_prefix("pulse-host ").unwrap_or_else(|| panic!("not a command: {line:?}"));
        for name in words.split_whitespace().next().unwrap().split('|') {
            let options =
                commands.get(name).unwrap_or_else(|| panic!("the README shows `{name}`: no such command"));
            let unknown: Vec<_> = flags(words).difference(options).cloned().collect();
            assert!(unknown.is_empty(), "the README shows `{name}` with {unknown:?}, which it does not take");
            shown.insert(name.to_owned());
        }
    }
    let missing: Vec<_> = commands.keys().filter(|name| !shown.contains(*name)).collect();
    assert!(missing.is_empty(), "the README's `Running it` does not show {missing:?}");
}
