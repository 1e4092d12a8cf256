//! Values that must never be printed: the HTTP token, Redis URLs that may
//! carry a password.

/// A secret string: its `Debug` and `Display` print `[redacted]`; only
/// [`Secret::expose`] gives the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for where it is used (never for a message).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(value))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// `url` with any password (and ACL user name's password) replaced by
/// `***`, for messages: `redis://app:***@host:6379/0`. Text that is not a
/// URL with credentials comes back unchanged.
pub fn redact_url(url: &str) -> String {
    let url = &redact_query(url);
    let Some(scheme_end) = url.find("://") else { return url.to_owned() };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else { return url.to_owned() };
    let user = match rest[..at].find(':') {
        Some(colon) => &rest[..colon],
        None if at > 0 => return format!("{}://***@{}", &url[..scheme_end], &rest[at + 1..]),
        None => "",
    };
    format!("{}://{user}:***@{}", &url[..scheme_end], &rest[at + 1..])
}

/// `redis+unix:///path?pass=…`: the password of a socket URL.
fn redact_query(url: &str) -> String {
    let Some(query) = url.find('?') else { return url.to_owned() };
    let pairs: Vec<String> = url[query + 1..]
        .split('&')
        .map(|pair| if pair.starts_with("pass=") { "pass=***".to_owned() } else { pair.to_owned() })
        .collect();
    format!("{}?{}", &url[..query], pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact_url("redis://:pw@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(redact_url("rediss://app:s3cret@h/1"), "rediss://app:***@h/1");
        assert_eq!(redact_url("redis://token@h"), "redis://***@h");
        assert_eq!(redact_url("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock"), "redis+unix:///tmp/r.sock");
        assert_eq!(redact_url("redis+sentinel://u:pw@h1:1,h2:2/m"), "redis+sentinel://u:***@h1:1,h2:2/m");
        assert_eq!(redact_url("rediss+cluster://:pw@h1:1,h2:2/"), "rediss+cluster://:***@h1:1,h2:2/");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("redis+unix:///r.sock?db=1&pass=pw"), "redis+unix:///r.sock?db=1&pass=***");
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?} {secret}"), "[redacted] [redacted]");
        assert_eq!(secret.expose(), "hunter2");
    }
}
