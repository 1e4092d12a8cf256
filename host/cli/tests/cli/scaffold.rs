//! `pulse-host new`: a plugin project written whole, or not at all. (Its
//! build and `try` in each language run in `.ci/scaffold-check`.)

use std::path::Path;
use std::process::Command;

/// Runs `new` with `args` in `dir`: exit code, stdout, stderr.
fn new(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(crate::binary()).current_dir(dir).arg("new").args(args).output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// The files under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

#[test]
fn each_language_gets_its_project_with_a_script_and_the_command_that_builds_it() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = new(dir.path(), &["hello-world"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("cargo build --release"), "{out}");
    let rust = dir.path().join("hello-world");
    assert_eq!(
        files(&rust),
        [".cargo/config.toml", ".gitignore", "Cargo.toml", "README.md", "script.txt", "src/lib.rs"]
    );
    let manifest = std::fs::read_to_string(rust.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("name = \"hello-world\""), "{manifest}");
    // The SDK of this tree, by a path that holds it.
    let sdk = manifest.lines().find(|line| line.starts_with("pulse-plugin")).unwrap();
    let sdk = sdk.split('"').nth(1).unwrap();
    assert!(Path::new(sdk).join("src/lib.rs").is_file(), "{sdk}");
    let readme = std::fs::read_to_string(rust.join("README.md")).unwrap();
    assert!(
        readme.contains("pulse-host try target/wasm32-wasip2/release/hello_world.wasm script.txt"),
        "{readme}"
    );
    assert!(!readme.contains("{{"), "a placeholder left: {readme}");

    let (code, out, err) = new(dir.path(), &["hello-py", "--lang", "python"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("componentize-py -d wit -w job-handler componentize app -o hello_py.wasm"), "{out}");
    assert_eq!(
        files(&dir.path().join("hello-py")),
        [".gitignore", "README.md", "app.py", "pulse_plugin.py", "script.txt", "wit/job.wit"]
    );

    let (code, out, err) = new(dir.path(), &["hello-js", "--lang", "js", "--dir", "elsewhere/js"]);
    assert_eq!(code, 0, "{out}{err}");
    let js = dir.path().join("elsewhere/js");
    assert_eq!(
        files(&js),
        [
            ".gitignore",
            "README.md",
            "app.js",
            "build.mjs",
            "package.json",
            "pulse-plugin.js",
            "script.txt",
            "wit/job.wit"
        ]
    );
    assert!(std::fs::read_to_string(js.join("build.mjs")).unwrap().contains("'hello_js.wasm'"));
}

#[test]
fn a_bad_name_or_an_existing_folder_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for (name, lang, says) in [
        ("1st", "rust", "starts with an ASCII letter"),
        ("hé", "python", "starts with an ASCII letter"),
        ("a/b", "js", "starts with an ASCII letter"),
        ("fn", "rust", "Rust keyword"),
        ("", "rust", "starts with an ASCII letter"),
    ] {
        let (code, _, err) = new(dir.path(), &[name, "--lang", lang]);
        assert_eq!(code, 1, "{name:?}: {err}");
        assert!(err.contains(says), "{name:?}: {err}");
    }
    let (code, _, err) = new(dir.path(), &["x", "--lang", "cobol"]);
    assert_eq!(code, 2, "clap refuses the language: {err}");
    assert!(err.contains("rust") && err.contains("python") && err.contains("js"), "{err}");
    assert!(files(dir.path()).is_empty(), "nothing written: {:?}", files(dir.path()));

    std::fs::create_dir(dir.path().join("taken")).unwrap();
    let (code, _, err) = new(dir.path(), &["taken"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("exists already"), "{err}");
    let (code, _, err) = new(dir.path(), &["other", "--sdk", "/nowhere"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no Rust SDK"), "{err}");
    // No staging folder left beside it.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["taken"]);
}
