//! The checks every value of config.toml goes through: ranges, names,
//! files, shares of instances, the HTTP section; each problem with its line.

use super::*;

/// Collects problems while reading values.
pub(super) struct Check<'a> {
    pub(super) text: &'a str,
    pub(super) problems: Vec<Problem>,
    /// What a key left out takes.
    pub(super) defaults: &'a Defaults,
}

impl Check<'_> {
    pub(super) fn problem<T>(&mut self, spanned: &Spanned<T>, message: String) {
        self.problems.push(Problem { line: Some(line_of(self.text, spanned.span().start)), message });
    }

    /// A duration within `range`, or `default` when absent (or wrong:
    /// then a problem says what is allowed).
    pub(super) fn duration(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: Duration,
        range: RangeInclusive<Duration>,
    ) -> Duration {
        let unit = Unit {
            what: "a duration",
            forms: DURATION_FORMS,
            parse: units::duration,
            show: units::show_duration,
        };
        self.ranged(key, value, default, &range, &unit)
    }

    /// A value written as a string with a unit, within `range`.
    fn ranged<T: PartialOrd + Copy>(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: T,
        range: &RangeInclusive<T>,
        unit: &Unit<T>,
    ) -> T {
        let Some(value) = value else { return default };
        let text = value.get_ref();
        match (unit.parse)(text) {
            None => {
                self.problem(value, format!("`{key}` = {text:?} is not {}: write {}", unit.what, unit.forms));
                default
            }
            Some(parsed) if !range.contains(&parsed) => {
                let (low, high) = ((unit.show)(*range.start()), (unit.show)(*range.end()));
                self.problem(
                    value,
                    format!("`{key}` = {text:?} is out of range: allowed are {low} to {high}"),
                );
                default
            }
            Some(parsed) => parsed,
        }
    }

    /// A number within `range`, or `default` when absent (or out of range:
    /// then a problem says what is allowed).
    pub(super) fn count(
        &mut self,
        key: &str,
        value: Option<&Spanned<u64>>,
        default: u64,
        range: RangeInclusive<u64>,
    ) -> u64 {
        let Some(value) = value else { return default };
        let number = *value.get_ref();
        if range.contains(&number) {
            return number;
        }
        self.problem(
            value,
            format!("`{key}` = {number} is out of range: allowed are {} to {}", range.start(), range.end()),
        );
        default
    }

    /// A power of two up to `max`, or `default` when absent (or not one:
    /// then a problem says what is allowed).
    pub(super) fn power_of_two(
        &mut self,
        key: &str,
        value: Option<&Spanned<u64>>,
        default: u64,
        max: u64,
    ) -> u64 {
        let Some(value) = value else { return default };
        let number = *value.get_ref();
        if number.is_power_of_two() && number <= max {
            return number;
        }
        let allowed: Vec<String> = (0..=max.ilog2()).map(|bit| (1u64 << bit).to_string()).collect();
        self.problem(value, format!("`{key}` = {number} is not allowed: allowed are {}", allowed.join(", ")));
        default
    }

    /// A plugin's or schedule's `limits`, checked against the runtime's.
    pub(super) fn limits(
        &mut self,
        what: &str,
        name: &Spanned<String>,
        limits: &PluginLimits,
        runtime: &RuntimeConfig,
    ) -> Limits {
        let d = self.defaults.limits;
        let checked = Limits {
            memory: self.size("limits.memory", limits.memory.as_ref(), d.memory, MEMORY),
            call_timeout: self.duration(
                "limits.call_timeout",
                limits.call_timeout.as_ref(),
                d.call_timeout,
                CALL_TIMEOUT,
            ),
            fuel: match &limits.fuel {
                Some(fuel) => Some(self.count("limits.fuel", Some(fuel), 1, FUEL)),
                None => d.fuel,
            },
            // Shared out once every plugin is read (`share_instances`).
            instances: 0,
            http_connect_timeout: self.duration(
                "limits.http_connect_timeout",
                limits.http_connect_timeout.as_ref(),
                d.http_connect_timeout,
                OUTBOUND_TIMEOUT,
            ),
            http_first_byte_timeout: self.duration(
                "limits.http_first_byte_timeout",
                limits.http_first_byte_timeout.as_ref(),
                d.http_first_byte_timeout,
                OUTBOUND_TIMEOUT,
            ),
            http_request_bytes: self.size(
                "limits.http_request_bytes",
                limits.http_request_bytes.as_ref(),
                d.http_request_bytes,
                HTTP_BODY_BYTES,
            ),
            http_response_bytes: self.size(
                "limits.http_response_bytes",
                limits.http_response_bytes.as_ref(),
                d.http_response_bytes,
                HTTP_BODY_BYTES,
            ),
            http_requests: self.count(
                "limits.http_requests",
                limits.http_requests.as_ref(),
                d.http_requests.into(),
                HTTP_REQUESTS,
            ) as u32,
        };
        if checked.memory > runtime.max_memory_per_instance
            && let Some(memory) = &limits.memory
        {
            self.problem(
                memory,
                format!(
                    "{what} {:?}: limits.memory exceeds runtime.max_memory_per_instance ({} bytes)",
                    name.get_ref(),
                    runtime.max_memory_per_instance
                ),
            );
        }
        if checked.fuel.is_some() && !runtime.fuel {
            self.problem(name, format!("{what} {:?}: limits.fuel needs runtime.fuel = true", name.get_ref()));
        }
        checked
    }

    /// A component's `path`: a file, resolved against the config's
    /// folder, or `oci://…` with its `allow_tags` and `verify`
    /// (`registry` tells whether `runtime.cache_dir` is set).
    pub(super) fn component(
        &mut self,
        what: &str,
        name: &str,
        base: &Path,
        path: &Spanned<String>,
        (allow_tags, verify): (Option<&Spanned<bool>>, Option<&Spanned<Verify>>),
        cache_dir: bool,
    ) -> Source {
        let context = format!("{what} {name:?}");
        if !pulse_oci::is_reference(path.get_ref()) {
            if let Some(allow_tags) = allow_tags {
                self.problem(
                    allow_tags,
                    format!("{context}: allow_tags applies to registry paths (oci://…); path is a file"),
                );
            }
            if let Some(verify) = verify {
                self.problem(
                    verify,
                    format!("{context}: verify checks a signature kept in a registry; path is a file (use oci://…, see `pulse-host push`)"),
                );
            }
            return Source::File(self.existing(
                base,
                path,
                &context,
                " (build plugins with scripts/build-plugins)",
            ));
        }
        let verify = verify.map(|verify| self.file("verify.key", base, &verify.get_ref().key));
        let reference = match pulse_oci::Reference::parse(path.get_ref()) {
            Ok(reference) => reference,
            Err(why) => {
                self.problem(path, format!("{context}: path {why}"));
                return Source::File(base.join(path.get_ref()));
            }
        };
        let tags_allowed = allow_tags.is_some_and(|allow| *allow.get_ref());
        if let (Some(tag), None, false) = (&reference.tag, &reference.digest, tags_allowed) {
            self.problem(
                path,
                format!(
                    "{context}: path names tag {tag:?} without a digest; a tag can move, and hosts would run different \
                     builds under one name: pin it with @sha256:… (what `pulse-host push` prints), or set allow_tags = true"
                ),
            );
        }
        if !cache_dir {
            self.problem(
                path,
                format!("{context}: path is a registry reference; set [runtime] cache_dir: pulled components are kept there"),
            );
        }
        Source::Registry { reference, verify }
    }

    /// A file the host reads at start (`key` names it), resolved against
    /// the config's folder.
    pub(super) fn file(&mut self, key: &str, base: &Path, path: &Spanned<String>) -> std::path::PathBuf {
        self.existing(base, path, &format!("`{key}`"), "")
    }

    /// `path` resolved against `base`; a problem, naming `context` and
    /// ending with `hint`, when no file is there.
    pub(super) fn existing(
        &mut self,
        base: &Path,
        path: &Spanned<String>,
        context: &str,
        hint: &str,
    ) -> std::path::PathBuf {
        let resolved = base.join(path.get_ref());
        if !resolved.is_file() {
            self.problem(path, format!("{context}: no file at {}{hint}", resolved.display()));
        }
        resolved
    }

    /// A plugin's or schedule's settings, each written out or read from
    /// the environment or a file (relative to `base`); one that cannot be
    /// read is a problem naming it.
    pub(super) fn settings(
        &mut self,
        base: &Path,
        raw: std::collections::BTreeMap<String, Spanned<super::RawSetting>>,
    ) -> std::collections::BTreeMap<String, crate::Setting> {
        use super::setting::Source;
        let mut settings = std::collections::BTreeMap::new();
        for (name, value) in raw {
            let setting = match value.get_ref().source() {
                Ok(Source::Text(text)) => crate::Setting::Plain(text.to_owned()),
                Err(why) => {
                    self.problem(&value, format!("setting `{name}`{why}"));
                    continue;
                }
                Ok(Source::Env(env)) => match std::env::var(env) {
                    Ok(text) => crate::Setting::Secret(crate::Secret::new(text)),
                    Err(_) => {
                        self.problem(
                            &value,
                            format!("setting `{name}` = {{ env = {env:?} }}: the variable is not set (or not UTF-8)"),
                        );
                        continue;
                    }
                },
                Ok(Source::File(file)) => {
                    let path = base.join(file);
                    match std::fs::read_to_string(&path) {
                        // A file written by `echo` ends with a newline that
                        // is not part of the value.
                        Ok(text) => crate::Setting::Secret(crate::Secret::new(
                            text.strip_suffix('\n').unwrap_or(&text).to_owned(),
                        )),
                        Err(error) => {
                            self.problem(
                                &value,
                                format!(
                                    "setting `{name}` = {{ file = {file:?} }}: cannot read {}: {error}",
                                    path.display()
                                ),
                            );
                            continue;
                        }
                    }
                }
            };
            settings.insert(name, setting);
        }
        settings
    }

    /// A pool, ticker or plugin name.
    pub(super) fn name(&mut self, what: &str, name: &Spanned<String>) -> bool {
        let valid = valid_name(name.get_ref());
        if !valid {
            self.problem(
                name,
                format!(
                    "{what} name {:?}: allowed are 1 to 100 ASCII letters, digits, '-', '_' or '.'",
                    name.get_ref()
                ),
            );
        }
        valid
    }

    /// The header name a plugin's requests carry their job's fence in:
    /// `pulse-fence` when absent, none when empty.
    pub(super) fn fence_header(&mut self, value: Option<&Spanned<String>>) -> Option<String> {
        let Some(value) = value else { return Some(FENCE_HEADER.to_owned()) };
        let name = value.get_ref();
        if name.is_empty() {
            return None;
        }
        let valid = name.len() <= 100
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str());
        if !valid {
            self.problem(
                value,
                format!(
                    "outbound_fence_header {name:?}: allowed are 1 to 100 ASCII letters, digits or '-', \
                     not a header HTTP itself uses ({}), or \"\" for no fence header",
                    RESERVED_HEADERS.join(", ")
                ),
            );
            return Some(FENCE_HEADER.to_owned());
        }
        Some(name.to_ascii_lowercase())
    }

    /// A size within `range`, or `default` when absent (or wrong: then a
    /// problem says what is allowed).
    pub(super) fn size(
        &mut self,
        key: &str,
        value: Option<&Spanned<String>>,
        default: u64,
        range: RangeInclusive<u64>,
    ) -> u64 {
        let unit = Unit { what: "a size", forms: SIZE_FORMS, parse: units::size, show: units::show_size };
        self.ranged(key, value, default, &range, &unit)
    }
}

/// The default of `outbound_fence_header`.
const FENCE_HEADER: &str = "pulse-fence";

/// Headers a fence may not be carried in: HTTP's own.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "expect",
];

/// How values of one kind are written: for [`Check::ranged`].
pub(super) struct Unit<T> {
    what: &'static str,
    forms: &'static str,
    parse: fn(&str) -> Option<T>,
    show: fn(T) -> String,
}

impl Check<'_> {
    /// Each plugin's and schedule's instance quota: the ones given, and an
    /// even share of what `runtime.max_instances` leaves for the others.
    /// The quotas may not add up to more than `max_instances`, so no pool
    /// can take the instances another one needs.
    pub(super) fn share_instances(
        &mut self,
        max_instances: u32,
        quotas: &[Option<Spanned<u64>>],
    ) -> Vec<u32> {
        let max = u64::from(max_instances);
        for quota in quotas.iter().flatten() {
            self.count("limits.instances", Some(quota), 1, 1..=max);
        }
        let given: u64 = quotas.iter().flatten().map(|q| *q.get_ref()).sum();
        let unset = quotas.iter().filter(|q| q.is_none()).count() as u64;
        let left = max.saturating_sub(given);
        if given > max || (unset > 0 && left < unset) {
            let message = format!(
                "the plugins' and schedules' `limits.instances` add up to {given}, and {unset} more need at least one each: \
                     `runtime.max_instances` is {max}; lower them or raise it"
            );
            match quotas.iter().flatten().last() {
                Some(at) => self.problem(at, message),
                None => self.problems.push(Problem { line: None, message }),
            }
        }
        let share = left.checked_div(unset).map_or(0, |share| share.max(1));
        quotas.iter().map(|q| q.as_ref().map_or(share, |q| *q.get_ref()) as u32).collect()
    }

    /// `[http]`: the address (a port alone means loopback), the token, the
    /// body limit.
    pub(super) fn http(&mut self, http: &Http, base: &Path) -> HttpConfig {
        let default_listen = std::net::SocketAddr::from(([127, 0, 0, 1], 7070));
        let listen = match &http.listen {
            None => default_listen,
            Some(value) => {
                let text = value.get_ref().trim();
                let parsed = text
                    .parse::<u16>()
                    .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
                    .or_else(|_| text.parse::<std::net::SocketAddr>());
                parsed.unwrap_or_else(|_| {
                    self.problem(
                        value,
                        format!(
                            "`http.listen` = {text:?} is not an address: write an IP and a port \
                             (\"127.0.0.1:7070\", \"0.0.0.0:7070\", \"[::1]:7070\") or a port alone for loopback"
                        ),
                    );
                    default_listen
                })
            }
        };
        let token = match (&http.token, &http.token_file) {
            (Some(_), Some(file)) => {
                self.problem(file, "`http.token` and `http.token_file` are both set: keep one".into());
                None
            }
            (Some(token), None) => self.token(token, token.get_ref(), "`http.token`"),
            (None, Some(file)) => {
                let path = base.join(file.get_ref());
                match std::fs::read_to_string(&path) {
                    Ok(text) => self.token(file, text.trim(), &format!("the token in {}", path.display())),
                    Err(error) => {
                        self.problem(
                            file,
                            format!("`http.token_file`: cannot read {}: {error}", path.display()),
                        );
                        None
                    }
                }
            }
            (None, None) => None,
        };
        let d = self.defaults.http;
        let max_body = self.size("http.max_body", http.max_body.as_ref(), d.max_body, MAX_BODY);
        let allowed_hosts = http
            .allowed_hosts
            .iter()
            .flatten()
            .filter_map(|host| {
                let name = host.get_ref().trim().to_ascii_lowercase();
                let valid = !name.is_empty()
                    && name.len() <= 253
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '[' | ']'));
                if !valid {
                    self.problem(
                        host,
                        format!("`http.allowed_hosts` entry {:?}: write a host name or address, such as \"pulse.example.com\"", host.get_ref()),
                    );
                }
                valid.then_some(name)
            })
            .collect();
        let tls = match (&http.tls_cert_file, &http.tls_key_file) {
            (Some(cert), Some(key)) => {
                Some((self.file("http.tls_cert_file", base, cert), self.file("http.tls_key_file", base, key)))
            }
            (Some(one), None) | (None, Some(one)) => {
                self.problem(
                    one,
                    "`http.tls_cert_file` and `http.tls_key_file` go together: set both".into(),
                );
                None
            }
            (None, None) => None,
        };
        HttpConfig {
            listen,
            token,
            tls,
            max_body,
            allowed_hosts,
            header_timeout: self.duration(
                "http.header_timeout",
                http.header_timeout.as_ref(),
                d.header_timeout,
                HTTP_TIMEOUT,
            ),
            idle_timeout: self.duration(
                "http.idle_timeout",
                http.idle_timeout.as_ref(),
                d.idle_timeout,
                HTTP_TIMEOUT,
            ),
            max_connections: self.count(
                "http.max_connections",
                http.max_connections.as_ref(),
                d.max_connections.into(),
                MAX_CONNECTIONS,
            ) as u32,
        }
    }

    /// The HTTP token written in the config (`http.token`) or read from
    /// `http.token_file`.
    pub(super) fn token(&mut self, at: &Spanned<String>, text: &str, what: &str) -> Option<Secret> {
        match crate::check_token(text) {
            Ok(()) => Some(Secret::new(text)),
            Err(allowed) => {
                self.problem(at, format!("{what} {allowed}"));
                None
            }
        }
    }

    /// `[telemetry]`: none when it names no collector.
    pub(super) fn telemetry(&mut self, telemetry: &Telemetry) -> Option<TelemetryConfig> {
        let Some(endpoint) = &telemetry.otlp_endpoint else {
            if let Some(other) = &telemetry.service_name {
                self.problem(other, "`[telemetry]` needs `otlp_endpoint`: the collector's OTLP/HTTP address, such as \"http://127.0.0.1:4318\"".into());
            }
            return None;
        };
        let text = endpoint.get_ref().trim().trim_end_matches('/').to_owned();
        let rest = text.strip_prefix("http://").or_else(|| text.strip_prefix("https://"));
        let valid = rest.is_some_and(|rest| {
            let authority = rest.split('/').next().unwrap_or_default();
            !authority.is_empty() && !rest.chars().any(char::is_whitespace)
        });
        if !valid {
            self.problem(
                endpoint,
                format!(
                    "`telemetry.otlp_endpoint` = {text:?} is not an OTLP/HTTP address: write http:// or https://, \
                     a host and a port, such as \"http://127.0.0.1:4318\" (spans go to <endpoint>/v1/traces)"
                ),
            );
        }
        let service_name = match &telemetry.service_name {
            None => "pulse-host".to_owned(),
            Some(name) => {
                let text = name.get_ref().trim();
                if text.is_empty() || text.len() > 100 {
                    self.problem(name, "`telemetry.service_name` must be 1 to 100 characters".into());
                }
                text.to_owned()
            }
        };
        let sample_ratio = match &telemetry.sample_ratio {
            None => 1.0,
            Some(ratio) => {
                let value = *ratio.get_ref();
                if !(0.0..=1.0).contains(&value) {
                    self.problem(
                        ratio,
                        format!("`telemetry.sample_ratio` = {value}: write a share of traces from 0.0 (none) to 1.0 (all)"),
                    );
                }
                value.clamp(0.0, 1.0)
            }
        };
        Some(TelemetryConfig { otlp_endpoint: text, service_name, sample_ratio })
    }
}
