//! Every Redis key this crate uses, and name validation.
//!
//! Keys share the hash tag `{tag}` (the pool's name in pulse-host), so a
//! stream, its groups' bookkeeping and the pool's other keys live in one
//! Redis Cluster slot and may appear in one script.

use crate::error::Error;

/// The Redis names of one stream.
#[derive(Debug, Clone)]
pub(crate) struct StreamKeys {
    tag: String,
    name: String,
    /// The stream itself.
    pub(crate) stream: String,
    /// The set of the stream's consumer groups (for `destroy`).
    pub(crate) groups: String,
}

impl StreamKeys {
    pub(crate) fn new(tag: &str, name: &str) -> Self {
        Self {
            tag: tag.to_owned(),
            name: name.to_owned(),
            stream: format!("pulse:{{{tag}}}:stream:{name}"),
            groups: format!("pulse:{{{tag}}}:stream:{name}:groups"),
        }
    }

    /// The sorted set of a group's consumers, by last heartbeat.
    pub(crate) fn consumers(&self, group: &str) -> String {
        format!("pulse:{{{}}}:stream:{}:group:{group}:consumers", self.tag, self.name)
    }
}

/// Checks a stream, group or tag name: 1 to 200 ASCII letters, digits and
/// `-`, `_`, `.`, `:`.
pub(crate) fn validate_name(what: &'static str, name: &str) -> Result<(), Error> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if name.is_empty() || name.len() > 200 || !name.chars().all(allowed) {
        return Err(Error::InvalidName {
            what,
            name: name.to_owned(),
            allowed: "1 to 200 ASCII letters, digits, '-', '_', '.' or ':'",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag() {
        let keys = StreamKeys::new("pool", "inbox");
        assert_eq!(keys.stream, "pulse:{pool}:stream:inbox");
        assert_eq!(keys.consumers("workers"), "pulse:{pool}:stream:inbox:group:workers:consumers");
        assert!(validate_name("stream name", "a:b-c_d.e").is_ok());
        assert!(validate_name("stream name", "a b").is_err());
        assert!(validate_name("stream name", "").is_err());
    }
}
