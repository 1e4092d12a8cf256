//! Every Redis key and channel name this crate uses, and the validation of
//! the names they are built from.
//!
//! All keys of a pool share the hash tag `{pool}` (ARCHITECTURE §4), so a
//! map of the pool lives in the pool's Redis Cluster slot and scripts may
//! touch it together with the pool's other keys.

use crate::error::Error;

/// Longest map name or hash tag, in bytes.
const MAX_NAME: usize = 200;

/// The Redis names of one map.
#[derive(Debug, Clone)]
pub(crate) struct MapKeys {
    /// The hash with the content, `=epoch` and `=rev`.
    pub(crate) hash: String,
    /// The pub/sub channel of its changes.
    pub(crate) channel: String,
}

impl MapKeys {
    pub(crate) fn new(tag: &str, name: &str) -> Self {
        Self {
            hash: format!("pulse:{{{tag}}}:map:{name}"),
            channel: format!("pulse:{{{tag}}}:map:{name}:changes"),
        }
    }
}

/// Checks a map name or hash tag: 1 to 200 ASCII letters, digits and
/// `-`, `_`, `.`, `:`.
pub(crate) fn validate_name(what: &'static str, name: &str) -> Result<(), Error> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(allowed) {
        return Err(Error::InvalidName {
            what,
            name: name.to_owned(),
            allowed: "1 to 200 ASCII letters, digits, '-', '_', '.' or ':'",
        });
    }
    Ok(())
}

/// Checks a key of a map: not empty and not starting with `=`, which marks
/// the map's own fields.
pub(crate) fn validate_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.starts_with('=') {
        return Err(Error::InvalidKey { key: key.to_owned() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag() {
        let keys = MapKeys::new("orders", "workers");
        assert_eq!(keys.hash, "pulse:{orders}:map:workers");
        assert_eq!(keys.channel, "pulse:{orders}:map:workers:changes");
    }

    #[test]
    fn names_and_keys_are_validated() {
        assert!(validate_name("map name", "pool-1:workers").is_ok());
        for bad in ["", "a b", "x{y}", "é", &"n".repeat(201)] {
            assert!(validate_name("map name", bad).is_err(), "{bad:?}");
        }
        assert!(validate_key("job/1=x").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key("=rev").is_err());
    }
}
