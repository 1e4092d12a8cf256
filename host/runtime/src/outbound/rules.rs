//! Allow-list entries: `https://api.example.com`, `http://127.0.0.1:8080`,
//! `https://*.example.com:*`, parsed once and matched against the scheme,
//! host and port a request is really sent to.

use std::str::FromStr;

/// One allowed destination: `http://host`, `https://host:port`,
/// `https://*.example.com:*`. Without a port, the scheme's own (80 or
/// 443); `*` is any port. A host starting with `*.` matches every name
/// below that suffix (not the suffix itself). Names compare without case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    https: bool,
    host: HostPattern,
    /// `None`: any port.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// Matches names ending in `.` + this.
    Below(String),
}

/// Why an allow-list entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{entry:?} {why}: allowed are \"http://HOST\", \"https://HOST\", with an optional \":PORT\" or \":*\", where HOST is a name, an IP address ([…] for IPv6) or \"*.\" and a name"
)]
pub struct AllowedHostError {
    entry: String,
    why: &'static str,
}

impl FromStr for AllowedHost {
    type Err = AllowedHostError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let refuse = |why| AllowedHostError { entry: entry.to_owned(), why };
        let (https, rest) = if let Some(rest) = entry.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = entry.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(refuse("has no http:// or https:// scheme"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(refuse("names more than a scheme, a host and a port"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            // An IPv6 address without a port: its colons are inside […].
            Some((host, port)) if !port.contains(']') => (host, Some(port)),
            _ => (rest, None),
        };
        let port = match port {
            None => Some(if https { 443 } else { 80 }),
            Some("*") => None,
            Some(port) => {
                Some(port.parse::<u16>().map_err(|_| refuse("has a port that is not 0 to 65535 or *"))?)
            }
        };
        let host = host.to_ascii_lowercase();
        let valid = |name: &str| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '[' | ']' | ':'))
        };
        let host = match host.strip_prefix("*.") {
            Some(suffix) if valid(suffix) && !suffix.contains(['[', ':', '*']) => {
                HostPattern::Below(suffix.to_owned())
            }
            Some(_) => return Err(refuse("has an invalid name after \"*.\"")),
            None if valid(&host) => HostPattern::Exact(host),
            None => return Err(refuse("has an invalid host")),
        };
        Ok(Self { https, host, port })
    }
}

impl AllowedHost {
    /// Whether a request to `host`:`port` over HTTPS (`https`) or HTTP is
    /// allowed by this entry.
    pub fn allows(&self, https: bool, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_matches = match &self.host {
            HostPattern::Exact(name) => *name == host,
            HostPattern::Below(suffix) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix.as_str())
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
        };
        self.https == https && host_matches && self.port.is_none_or(|allowed| allowed == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(entry: &str) -> AllowedHost {
        entry.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_entry_allows_its_scheme_host_and_port_only() {
        let exact = rule("https://api.example.com");
        assert!(exact.allows(true, "api.example.com", 443));
        assert!(exact.allows(true, "API.Example.com", 443), "names compare without case");
        assert!(!exact.allows(false, "api.example.com", 443), "another scheme");
        assert!(!exact.allows(true, "api.example.com", 8443), "another port");
        assert!(!exact.allows(true, "example.com", 443), "another host");
        assert!(!exact.allows(true, "api.example.com.evil.net", 443), "a longer name");
        let port = rule("http://127.0.0.1:8080");
        assert!(port.allows(false, "127.0.0.1", 8080));
        assert!(!port.allows(false, "127.0.0.1", 80));
        let any_port = rule("http://localhost:*");
        assert!(any_port.allows(false, "localhost", 1) && any_port.allows(false, "localhost", 65535));
        let ipv6 = rule("http://[::1]:9000");
        assert!(ipv6.allows(false, "[::1]", 9000));
    }

    #[test]
    fn a_wildcard_allows_the_names_below_it_not_itself() {
        let below = rule("https://*.example.com:443");
        assert!(below.allows(true, "a.example.com", 443));
        assert!(below.allows(true, "a.b.example.com", 443));
        assert!(!below.allows(true, "example.com", 443), "the suffix itself");
        assert!(!below.allows(true, "badexample.com", 443), "a name that only ends alike");
        assert!(!below.allows(true, "a.example.com", 80), "another port");
    }

    #[test]
    fn malformed_entries_are_refused_with_what_is_allowed() {
        for entry in [
            "api.example.com",
            "ftp://example.com",
            "https://example.com/path",
            "https://user@example.com",
            "https://example.com:99999",
            "https://*.",
            "https://a.*.example.com",
            "https://",
        ] {
            let error = entry.parse::<AllowedHost>().unwrap_err().to_string();
            assert!(error.contains(entry) && error.contains("allowed are"), "{entry}: {error}");
        }
    }
}
