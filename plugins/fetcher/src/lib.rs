//! `fetcher`: one job per HTTP endpoint, polled on a timer; emits the body
//! when it changes.
//!
//! - The job's key names the endpoint; its payload is the URL, optionally
//!   followed by a space and the polling interval in milliseconds (default
//!   `interval-ms` from the settings, else 10,000): `https://api.example.com/status 5000`.
//! - `start` polls at once, then every interval (a repeating timer).
//! - A poll sends `GET` (with `If-None-Match` when the last answer had an
//!   `ETag`, and `X-Fetcher-Run`: this run's fencing token, read with
//!   `env.fence`, so an endpoint can tell runs apart). The host adds the
//!   job's whole fence to every request (`pulse-fence: <pool>/<key>/<token>`),
//!   so an endpoint that keeps the newest token per job refuses a late
//!   request of a run that lost the job. An answer whose body hashes differently from the last one
//!   emitted is emitted (`<status> <body>`); the hash and the `ETag` are
//!   saved as the job's state, so a job that moves to another host does not
//!   emit the same body again. A failed request emits `error <reason>`
//!   once, until the next change.
//! - A notification with an empty payload polls at once; one with a
//!   payload is sent to the endpoint as the body of a `POST`
//!   (`Content-Type: application/octet-stream`), and the answer emitted
//!   as `<status> <body>`.
//! - The host sends a request only to what `allowed_outbound_hosts` lists
//!   for the plugin, and only while the job runs here.

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });

use exports::pulse::job::handler::Guest;
use pulse::job::types::{Job, JobError, LogLevel};
use pulse::job::{env, host};
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasi::io::streams::StreamError;

struct Fetcher;

/// What a job keeps across polls and moves: the last body's hash (or
/// error) and its `ETag`.
#[derive(Default, PartialEq)]
struct Seen {
    hash: String,
    etag: String,
}

impl Seen {
    fn parse(state: &[u8]) -> Self {
        let text = String::from_utf8_lossy(state);
        let mut lines = text.lines();
        Self {
            hash: lines.next().unwrap_or_default().to_owned(),
            etag: lines.next().unwrap_or_default().to_owned(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        format!("{}\n{}", self.hash, self.etag).into_bytes()
    }
}

/// The endpoint of a job, from its payload, and this run's id.
struct Endpoint {
    url: String,
    interval_ms: u64,
    run: String,
}

impl Endpoint {
    fn parse(payload: &[u8]) -> Result<Self, JobError> {
        let text = std::str::from_utf8(payload).map_err(|_| {
            JobError::InvalidInput("the payload is not UTF-8: expected \"URL [interval-ms]\"".into())
        })?;
        let mut words = text.split_whitespace();
        let url = words.next().unwrap_or_default();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(JobError::InvalidInput(format!(
                "{url:?} is not an http:// or https:// URL: expected \"URL [interval-ms]\""
            )));
        }
        let default = env::config("interval-ms").and_then(|ms| ms.parse().ok()).unwrap_or(10_000);
        let interval_ms = match words.next() {
            Some(ms) => ms.parse::<u64>().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                JobError::InvalidInput(format!("interval {ms:?} is not a positive number of ms"))
            })?,
            None => default,
        };
        // The fence's token names the run; a host too old to give one
        // gets a random name.
        let run = env::fence().map_or_else(
            || format!("{:016x}", wasi::random::random::get_random_u64()),
            |fence| fence.token.to_string(),
        );
        Ok(Self { url: url.to_owned(), interval_ms, run })
    }
}

thread_local! {
    /// Each job's endpoint and what it saw last. In job isolation an
    /// instance holds one job; in worker isolation, many.
    static JOBS: std::cell::RefCell<std::collections::HashMap<String, (Endpoint, Seen)>> =
        Default::default();
}

impl Guest for Fetcher {
    fn start(job: Job) -> Result<(), JobError> {
        let endpoint = Endpoint::parse(&job.payload)?;
        let seen = job.state.as_deref().map(Seen::parse).unwrap_or_default();
        host::set_timer(&job.key, "poll", endpoint.interval_ms, true)
            .map_err(|e| JobError::Retryable(format!("could not arm the poll timer: {e:?}")))?;
        JOBS.with(|jobs| jobs.borrow_mut().insert(job.key.clone(), (endpoint, seen)));
        poll(&job.key)
    }

    fn stop(key: String) -> Result<(), JobError> {
        JOBS.with(|jobs| jobs.borrow_mut().remove(&key));
        Ok(())
    }

    fn notify(key: String, payload: Vec<u8>) -> Result<(), JobError> {
        if payload.is_empty() {
            return poll(&key);
        }
        let Some((url, run)) = JOBS.with(|jobs| {
            jobs.borrow().get(&key).map(|(endpoint, _)| (endpoint.url.clone(), endpoint.run.clone()))
        }) else {
            return Err(JobError::Fatal(format!("{key:?} is not a job of this instance")));
        };
        let event = match send(&url, &run, "", Some(&payload)) {
            Ok(Answer { status, body, .. }) => [format!("{status} ").into_bytes(), body].concat(),
            Err(reason) => format!("error {reason}").into_bytes(),
        };
        host::emit(&key, &event).map_err(|e| JobError::Retryable(format!("emit refused: {e:?}")))
    }

    fn on_timer(key: String, _name: String) -> Result<(), JobError> {
        poll(&key)
    }
}

/// Polls job `key`'s endpoint; emits and saves what changed.
fn poll(key: &str) -> Result<(), JobError> {
    let Some((url, run, etag)) = JOBS.with(|jobs| {
        jobs.borrow()
            .get(key)
            .map(|(endpoint, seen)| (endpoint.url.clone(), endpoint.run.clone(), seen.etag.clone()))
    }) else {
        return Err(JobError::Fatal(format!("{key:?} is not a job of this instance")));
    };
    let (seen, event) = match send(&url, &run, &etag, None) {
        Ok(Answer { status: 304, .. }) => return Ok(()),
        Ok(Answer { status, etag, body }) => {
            let seen = Seen { hash: format!("{:016x}", fnv1a(&body)), etag };
            let mut event = format!("{status} ").into_bytes();
            event.extend_from_slice(&body);
            (seen, event)
        }
        Err(reason) => {
            env::log(LogLevel::Warn, &format!("GET {url} failed: {reason}"));
            (
                Seen { hash: format!("error {reason}"), etag: String::new() },
                format!("error {reason}").into_bytes(),
            )
        }
    };
    let changed = JOBS.with(|jobs| jobs.borrow().get(key).is_some_and(|(_, last)| last.hash != seen.hash));
    if changed {
        host::emit(key, &event).map_err(|e| JobError::Retryable(format!("emit refused: {e:?}")))?;
    }
    host::save_state(key, &seen.encode())
        .map_err(|e| JobError::Retryable(format!("save-state refused: {e:?}")))?;
    JOBS.with(|jobs| {
        if let Some((_, last)) = jobs.borrow_mut().get_mut(key) {
            *last = seen;
        }
    });
    Ok(())
}

struct Answer {
    status: u16,
    etag: String,
    body: Vec<u8>,
}

/// `GET url` from run `run`, with `If-None-Match: etag` unless it is
/// empty; or `POST url` with `body`.
fn send(url: &str, run: &str, etag: &str, body: Option<&[u8]>) -> Result<Answer, String> {
    let (scheme, rest) = match url.strip_prefix("https://") {
        Some(rest) => (Scheme::Https, rest),
        None => (Scheme::Http, url.strip_prefix("http://").unwrap_or(url)),
    };
    let (authority, path) = rest.find('/').map_or((rest, "/"), |at| rest.split_at(at));
    let headers = Fields::new();
    headers.append("x-fetcher-run", run.as_bytes()).map_err(|e| format!("{e:?}"))?;
    if !etag.is_empty() {
        headers.append("if-none-match", etag.as_bytes()).map_err(|e| format!("{e:?}"))?;
    }
    if let Some(body) = body {
        headers.append("content-type", b"application/octet-stream").map_err(|e| format!("{e:?}"))?;
        headers.append("content-length", body.len().to_string().as_bytes()).map_err(|e| format!("{e:?}"))?;
    }
    let request = OutgoingRequest::new(headers);
    let method = if body.is_some() { Method::Post } else { Method::Get };
    let set = request.set_method(&method).is_ok()
        && request.set_scheme(Some(&scheme)).is_ok()
        && request.set_authority(Some(authority)).is_ok()
        && request.set_path_with_query(Some(path)).is_ok();
    if !set {
        return Err(format!("{url:?} is not a valid URL"));
    }
    let outgoing = request.body().map_err(|()| "the request's body was taken already".to_owned())?;
    let pending = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    let written = body.map_or(Ok(()), |body| write_body(&outgoing, body));
    let finished = written.and_then(|()| OutgoingBody::finish(outgoing, None).map_err(|e| format!("{e:?}")));
    // When the host refuses the request (a body over its
    // `http_request_bytes`), writing the body fails with `closed`: the
    // reason is in the response, so it is asked for first.
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        _ => return Err(finished.err().unwrap_or_else(|| "no response".into())),
    };
    finished?;
    let status = response.status();
    let etag = response
        .headers()
        .get("etag")
        .first()
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .unwrap_or_default();
    let body = response.consume().map_err(|()| "the body was taken already".to_owned())?;
    let stream = body.stream().map_err(|()| "the body's stream was taken already".to_owned())?;
    let mut out = Vec::new();
    loop {
        match stream.blocking_read(64 << 10) {
            Ok(chunk) => out.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(error)) => {
                let reason = wasi::http::types::http_error_code(&error)
                    .map_or_else(|| error.to_debug_string(), |code| format!("{code:?}"));
                return Err(reason);
            }
        }
    }
    drop(stream);
    drop(IncomingBody::finish(body));
    Ok(Answer { status, etag, body: out })
}

/// Writes `body` to a request's `outgoing` body, 4 KiB at a time.
fn write_body(outgoing: &OutgoingBody, body: &[u8]) -> Result<(), String> {
    let stream = outgoing.write().map_err(|()| "the request's stream was taken already".to_owned())?;
    for chunk in body.chunks(4096) {
        stream.blocking_write_and_flush(chunk).map_err(|e| format!("{e:?}"))?;
    }
    Ok(())
}

/// FNV-1a, 64 bits: the same on every host and build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

export!(Fetcher);
