//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]`: where a component is
//! kept in a registry, parsed once with every rule it breaks named.

use std::fmt;

/// The scheme a plugin's `path` starts with when it names a registry.
pub const SCHEME: &str = "oci://";

/// A component in a registry: a repository and a digest, a tag, or both
/// (the digest then decides; the tag is only shown).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `name[/name...]`, lower case.
    pub repository: String,
    /// The tag, if written.
    pub tag: Option<String>,
    /// `sha256:<64 hex>`, if written: the manifest's digest.
    pub digest: Option<String>,
}

/// Whether `path` names a registry (it starts with `oci://`).
pub fn is_reference(path: &str) -> bool {
    path.starts_with(SCHEME)
}

impl Reference {
    /// Parses `oci://…`. The error says which part is wrong and what is
    /// allowed.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text.strip_prefix(SCHEME).ok_or_else(|| {
            format!("{text:?} is not a registry reference: it must start with {SCHEME} (oci://registry/name@sha256:…)")
        })?;
        let (registry, rest) = rest
            .split_once('/')
            .ok_or_else(|| format!("{text:?} names no repository: write oci://registry/name@sha256:…"))?;
        check_registry(registry).map_err(|why| format!("{text:?}: registry {registry:?} {why}"))?;
        let (rest, digest) = match rest.split_once('@') {
            Some((rest, digest)) => {
                check_digest(digest).map_err(|why| format!("{text:?}: {why}"))?;
                (rest, Some(digest.to_owned()))
            }
            None => (rest, None),
        };
        // A tag follows the last ':' after the last '/'.
        let (repository, tag) = match rest.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => (repository, Some(tag.to_owned())),
            _ => (rest, None),
        };
        check_repository(repository).map_err(|why| format!("{text:?}: repository {repository:?} {why}"))?;
        if let Some(tag) = &tag {
            check_tag(tag).map_err(|why| format!("{text:?}: tag {tag:?} {why}"))?;
        }
        if tag.is_none() && digest.is_none() {
            return Err(format!(
                "{text:?} has neither a digest nor a tag: add @sha256:… (what `pulse-host push` prints)"
            ));
        }
        Ok(Self { registry: registry.to_owned(), repository: repository.to_owned(), tag, digest })
    }

    /// The same repository at `digest`.
    pub fn at(&self, digest: &str) -> Self {
        Self { digest: Some(digest.to_owned()), ..self.clone() }
    }

    /// The same without its tag (a digest then names it alone).
    pub fn untagged(&self) -> Self {
        Self { tag: None, ..self.clone() }
    }

    /// What a manifest request names: the digest if written, else the tag.
    pub(crate) fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .expect("a reference has a digest or a tag (parse checks)")
    }

    /// Whether the registry is reached over plain HTTP: only on loopback
    /// (`localhost`, `127.*`, `[::1]`), where a development registry runs;
    /// every other registry over HTTPS.
    pub fn plain_http(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
            _ => &self.registry,
        };
        host == "localhost" || host.starts_with("127.") || host == "[::1]"
    }

    /// `http(s)://registry/v2/repository/`.
    pub(crate) fn base_url(&self) -> String {
        let scheme = if self.plain_http() { "http" } else { "https" };
        format!("{scheme}://{}/v2/{}", self.registry, self.repository)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

fn check_registry(registry: &str) -> Result<(), &'static str> {
    // `[v6 address]` or a name, then an optional `:port`.
    let (host, port) = match registry.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((address, rest)) => (address, rest.strip_prefix(':')),
            None => return Err("opens an IPv6 address with '[' and never closes it"),
        },
        None => match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        },
    };
    if port.is_some_and(|port| port.parse::<u16>().map_or(true, |port| port == 0)) {
        return Err("has a port that is not a number from 1 to 65535");
    }
    let ipv6 = registry.starts_with('[');
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-' || (ipv6 && c == ':');
    if !host.is_empty() && host.chars().all(allowed) {
        Ok(())
    } else {
        Err("is not a host name (letters, digits, '.', '-') with an optional :port")
    }
}

/// Lower-case letters and digits, parts joined by one '.', '_', '__' or
/// '-'s, components by '/' (the distribution spec's rule).
fn check_repository(repository: &str) -> Result<(), &'static str> {
    let component_ok = |part: &str| {
        let bytes = part.as_bytes();
        !part.is_empty()
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && !part.contains("..")
    };
    if !repository.is_empty() && repository.len() <= 255 && repository.split('/').all(component_ok) {
        Ok(())
    } else {
        Err(
            "is not a repository name: lower-case letters and digits, joined by '.', '_' or '-', parts by '/'",
        )
    }
}

fn check_tag(tag: &str) -> Result<(), &'static str> {
    let first_ok = tag.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if first_ok && tag.len() <= 128 && tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        Ok(())
    } else {
        Err("is not a tag: letters, digits, '_', '.', '-', at most 128, not starting with '.' or '-'")
    }
}

/// `sha256:` and 64 lower-case hex digits.
pub(crate) fn check_digest(digest: &str) -> Result<(), String> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) =>
        {
            Ok(())
        }
        _ => Err(format!("digest {digest:?} is not sha256: followed by 64 lower-case hex digits")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_reference_by_digest_tag_or_both_parses_and_prints_as_written() {
        for text in [
            format!("oci://ghcr.io/acme/plugins/echo@{D}"),
            "oci://localhost:5000/echo:v1".to_owned(),
            format!("oci://127.0.0.1:5000/echo:v1@{D}"),
        ] {
            let reference = Reference::parse(&text).unwrap();
            assert_eq!(reference.to_string(), text);
        }
        let reference = Reference::parse("oci://localhost:5000/a/b-c:1.0").unwrap();
        assert_eq!(reference.registry, "localhost:5000");
        assert_eq!(reference.repository, "a/b-c");
        assert_eq!(reference.tag.as_deref(), Some("1.0"));
        assert!(reference.plain_http());
        assert!(!Reference::parse(&format!("oci://ghcr.io/x@{D}")).unwrap().plain_http());
        assert_eq!(reference.base_url(), "http://localhost:5000/v2/a/b-c");
    }

    #[test]
    fn each_broken_part_is_named() {
        for (text, says) in [
            ("ghcr.io/x:1", "must start with oci://"),
            ("oci://ghcr.io", "names no repository"),
            ("oci://ghcr.io/Echo:1", "repository \"Echo\""),
            ("oci://ghcr.io/echo", "neither a digest nor a tag"),
            ("oci://ghcr.io/echo@sha256:12", "64 lower-case hex"),
            ("oci://ghcr.io/echo:-x", "tag \"-x\""),
            ("oci://gh cr.io/echo:1", "registry \"gh cr.io\""),
            ("oci://ghcr.io:99999/echo:1", "port"),
        ] {
            let error = Reference::parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
