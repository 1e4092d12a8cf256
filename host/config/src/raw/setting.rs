//! A plugin's or schedule's setting as config.toml writes it, and where
//! its value comes from.

use serde::Deserialize;

/// The forms a setting may take, for messages.
pub(super) const SETTING_FORMS: &str =
    "a setting is a string (\"text\"), { env = \"NAME\" } or { file = \"path\" }";

/// A setting's value as written. Tables and other values are kept as they
/// are, so the check can name the setting, its line and what is wrong,
/// instead of serde's "did not match any variant" (or a table whose other
/// keys are silently ignored).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawSetting {
    Text(String),
    Table(toml::Table),
    Other(toml::Value),
}

/// Where a setting's value comes from.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Source<'a> {
    /// Written out.
    Text(&'a str),
    /// `{ env = "NAME" }`: an environment variable.
    Env(&'a str),
    /// `{ file = "path" }`: a file, relative to config.toml.
    File(&'a str),
}

impl RawSetting {
    /// Where the value comes from. Err says what is wrong and the forms
    /// allowed, to follow the setting's name ("setting `x`" + Err); it
    /// names a table's keys but never shows their values (a secret may be
    /// written in the wrong place).
    pub(super) fn source(&self) -> Result<Source<'_>, String> {
        let table = match self {
            Self::Text(text) => return Ok(Source::Text(text)),
            Self::Other(value @ toml::Value::Array(_)) => {
                return Err(format!(" is {}; {SETTING_FORMS}", value.type_str()));
            }
            Self::Other(value) => {
                let what = if value.is_integer() || value.is_float() { "a number" } else { "it" };
                return Err(format!(
                    " is {} {value}; {SETTING_FORMS} (write {what} as \"{value}\")",
                    value.type_str()
                ));
            }
            Self::Table(table) => table,
        };
        let unknown: Vec<String> = table
            .keys()
            .filter(|key| !matches!(key.as_str(), "env" | "file"))
            .map(|k| format!("`{k}`"))
            .collect();
        if !unknown.is_empty() {
            let verb = if unknown.len() == 1 { "is not a key" } else { "are not keys" };
            return Err(format!(": {} {verb} of a setting table; {SETTING_FORMS}", unknown.join(", ")));
        }
        let text = |key: &str, value: &'_ toml::Value| match value {
            toml::Value::String(_) => Ok(()),
            other => Err(format!(": `{key}` is {} {other}, not a string; {SETTING_FORMS}", other.type_str())),
        };
        match (table.get("env"), table.get("file")) {
            (Some(_), Some(_)) => Err(format!(" has both `env` and `file`, but takes one; {SETTING_FORMS}")),
            (None, None) => Err(format!(" is an empty table; {SETTING_FORMS}")),
            (Some(env), None) => text("env", env).map(|()| Source::Env(env.as_str().unwrap_or_default())),
            (None, Some(file)) => {
                text("file", file).map(|()| Source::File(file.as_str().unwrap_or_default()))
            }
        }
    }
}
