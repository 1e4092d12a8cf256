//! `pulse-host new NAME --lang rust|python|js`: writes a plugin project
//! that builds with its documented command and runs under `pulse-host try`
//! as written. The project is written into a temporary folder beside its
//! destination and renamed into place: a failure leaves nothing behind.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// The languages a plugin project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// The contract every project builds against (Python and JavaScript read
/// it from the project; Rust through the SDK, and Python through its SDK
/// module, which the project holds too).
const WIT: &str = include_str!("../../../wit/job.wit");

/// Where the Rust SDK of the tree this binary was built from lies.
const SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sdk/rust");

/// Rust keywords, which a crate may not be named.
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false",
    "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return",
    "self", "Self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while",
    "abstract", "become", "box", "do", "final", "gen", "macro", "override", "priv", "try", "typeof",
    "unsized", "virtual", "yield",
];

/// Checks `name`: a letter, then letters, digits, `-` or `_`, at most 64
/// bytes; for Rust, not a keyword (a crate name) nor `test`.
///
/// # Errors
/// What is wrong and what is allowed.
pub fn check_name(name: &str, lang: Lang) -> anyhow::Result<()> {
    let allowed =
        "a name starts with an ASCII letter and holds only ASCII letters, digits, `-` and `_` (at most 64)";
    let valid = name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        bail!("{name:?} is not a valid plugin name: {allowed}");
    }
    if lang == Lang::Rust && (KEYWORDS.contains(&name.replace('-', "_").as_str()) || name == "test") {
        bail!("{name:?} is not a valid crate name: it is a Rust keyword or reserved; choose another");
    }
    Ok(())
}

/// Writes project `name` in `lang` into `dir` (`./NAME` when `None`),
/// with `sdk` as the Rust SDK's path (the tree's when `None`); returns
/// the folder and the command that builds it.
///
/// # Errors
/// A bad name, an existing destination, or a file that could not be
/// written (then nothing is left).
pub fn new(
    name: &str,
    lang: Lang,
    dir: Option<&Path>,
    sdk: Option<&Path>,
) -> anyhow::Result<(PathBuf, String)> {
    check_name(name, lang)?;
    let dest = dir.map_or_else(|| PathBuf::from(name), Path::to_path_buf);
    if dest.exists() {
        bail!("{} exists already: `new` writes a new folder only", dest.display());
    }
    let file = name.replace('-', "_");
    let (files, build, wasm) = match lang {
        Lang::Rust => {
            let sdk = match sdk {
                Some(sdk) => Some(sdk.to_path_buf()),
                None => Path::new(SDK).canonicalize().ok(),
            };
            let sdk = match sdk {
                Some(path) if path.join("Cargo.toml").is_file() => {
                    format!("pulse-plugin = {{ path = {:?} }}", path.display().to_string())
                }
                Some(path) => bail!(
                    "{} holds no Rust SDK (no Cargo.toml): give --sdk the path of sdk/rust",
                    path.display()
                ),
                None => "pulse-plugin = \"0.1\"".to_owned(),
            };
            let files = vec![
                ("Cargo.toml", include_str!("../templates/rust/Cargo.toml").replace("{{sdk}}", &sdk)),
                (".cargo/config.toml", include_str!("../templates/rust/config.toml").to_owned()),
                ("src/lib.rs", include_str!("../templates/rust/src/lib.rs").to_owned()),
            ];
            (files, "cargo build --release".to_owned(), format!("target/wasm32-wasip2/release/{file}.wasm"))
        }
        Lang::Python => {
            let files = vec![
                ("app.py", include_str!("../templates/python/app.py").to_owned()),
                // The Python SDK, beside the app, where componentize-py finds it.
                ("pulse_plugin.py", include_str!("../../../sdk/python/pulse_plugin.py").to_owned()),
                ("wit/job.wit", WIT.to_owned()),
            ];
            let build = format!("componentize-py -d wit -w job-handler componentize app -o {file}.wasm");
            (files, build, format!("{file}.wasm"))
        }
        Lang::Js => {
            let files = vec![
                ("app.js", include_str!("../templates/js/app.js").to_owned()),
                ("pulse-plugin.js", include_str!("../../../sdk/js/pulse-plugin.js").to_owned()),
                ("build.mjs", include_str!("../templates/js/build.mjs").to_owned()),
                ("package.json", include_str!("../templates/js/package.json").to_owned()),
                ("wit/job.wit", WIT.to_owned()),
            ];
            (files, "npm install && npm run build".to_owned(), format!("{file}.wasm"))
        }
    };
    let lang_name = match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    };
    let readme = include_str!("../templates/README.md")
        .replace("{{lang}}", lang_name)
        .replace("{{build}}", &build)
        .replace("{{wasm}}", &wasm);
    let common = [
        ("README.md", readme),
        ("script.txt", include_str!("../templates/script.txt").to_owned()),
        (".gitignore", include_str!("../templates/gitignore").to_owned()),
    ];
    let parent = match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{file}-"))
        .tempdir_in(&parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    for (path, text) in files.into_iter().chain(common) {
        let text = text.replace("{{name}}", name).replace("{{file}}", &file);
        let at = staging.path().join(path);
        if let Some(folder) = at.parent() {
            std::fs::create_dir_all(folder).with_context(|| format!("cannot create {}", folder.display()))?;
        }
        std::fs::write(&at, text).with_context(|| format!("cannot write {}", at.display()))?;
    }
    let staged = staging.keep();
    if let Err(error) = std::fs::rename(&staged, &dest) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(error).with_context(|| format!("cannot create {}", dest.display()));
    }
    Ok((dest, build))
}
