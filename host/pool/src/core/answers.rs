//! The answers of the pool's scripts and of its workers, typed: each is
//! parsed in one place, so a word that changes on one side fails to
//! compile on the other instead of failing at run time.

use redis::Value;

use crate::error::{Error, Result};
use crate::job::JobState;

/// The status word and optional detail of a script's answer.
fn status(answer: &[Value], op: &'static str) -> Result<(String, String)> {
    let text = |value: Option<&Value>| -> Option<String> {
        match value? {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(text) => Some(text.clone()),
            Value::Int(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let status = text(answer.first()).ok_or_else(|| protocol(op, &format!("{answer:?}")))?;
    Ok((status, text(answer.get(1)).unwrap_or_default()))
}

/// An answer this version does not understand.
pub(crate) fn protocol(op: &'static str, answer: &str) -> Error {
    Error::Protocol { op, answer: answer.to_owned() }
}

/// What `dispatch.lua` did with a new job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dispatched {
    /// The start is in the worker's inbox.
    Sent,
    /// No worker: the job waits.
    Queued,
    /// The key is taken by a job in this state.
    Exists(JobState),
    /// The pool holds `max_jobs` jobs.
    Full,
    /// The slot table changed: route again once the replica has this
    /// revision.
    Stale(String),
}

impl Dispatched {
    pub(crate) fn parse(answer: &[Value]) -> Result<Self> {
        let (status, detail) = status(answer, "dispatch")?;
        Ok(match status.as_str() {
            "sent" => Self::Sent,
            "queued" => Self::Queued,
            "exists" => Self::Exists(JobState::parse(&detail).ok_or_else(|| protocol("dispatch", &detail))?),
            "full" => Self::Full,
            "stale" => Self::Stale(detail),
            other => return Err(protocol("dispatch", other)),
        })
    }
}

/// What `route.lua` did with a stop or notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Routed {
    /// In the owner's inbox.
    Sent,
    /// Held for the job's next start.
    Held,
    /// A stop of a waiting job: removed at once.
    Stopped,
    /// No such job.
    Missing,
    /// The job failed, for this reason.
    Failed(String),
    /// Owned by this worker, not the one the caller expected.
    Owner(String),
}

impl Routed {
    pub(crate) fn parse(answer: &[Value]) -> Result<Self> {
        let (status, detail) = status(answer, "route")?;
        Ok(match status.as_str() {
            "sent" => Self::Sent,
            "held" => Self::Held,
            "stopped" => Self::Stopped,
            "missing" => Self::Missing,
            "failed" => Self::Failed(detail),
            "owner" => Self::Owner(detail),
            other => return Err(protocol("route", other)),
        })
    }
}

/// What `assign.lua` did with a queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Assigned {
    /// Started on the worker (or nothing to do: the job is not queued, or
    /// the pool shuts down).
    Done,
    /// The slot table changed: route again once the replica has this
    /// revision.
    Stale(String),
}

impl Assigned {
    pub(crate) fn parse(answer: &[Value]) -> Result<Self> {
        let (status, detail) = status(answer, "assign")?;
        Ok(match status.as_str() {
            "sent" | "skip" => Self::Done,
            "stale" => Self::Stale(detail),
            other => return Err(protocol("assign", other)),
        })
    }
}

/// What `join.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Join {
    /// A member, with the slot table's revision after the join.
    Member(String),
    /// The pool shuts down.
    ShuttingDown,
    /// The pool's epoch is now this one: Redis lost the pool's data.
    Epoch(String),
}

impl Join {
    pub(crate) fn parse(answer: &[Value]) -> Result<Self> {
        let (status, detail) = status(answer, "join")?;
        Ok(match status.as_str() {
            "joined" => Self::Member(detail),
            "shutdown" => Self::ShuttingDown,
            "epoch" => Self::Epoch(detail),
            other => return Err(protocol("join", other)),
        })
    }
}

/// A worker's answer to a start, stop or notification: the name of its
/// entry on the asking node's reply stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler's `start` returned.
    Started,
    /// The handler refused the job's input.
    Refused,
    /// The job failed (its start, for good).
    Failed,
    /// The handler's `stop` returned.
    Stopped,
    /// The handler's `notify` returned.
    Notified,
    /// The worker does not run the job.
    Missing,
    /// The handler's `stop` or `notify` failed.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 7] = [
        Outcome::Started,
        Outcome::Refused,
        Outcome::Failed,
        Outcome::Stopped,
        Outcome::Notified,
        Outcome::Missing,
        Outcome::Error,
    ];

    /// Its name on the reply stream.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Started => "started",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::Stopped => "stopped",
            Outcome::Notified => "notified",
            Outcome::Missing => "missing",
            Outcome::Error => "error",
        }
    }

    /// The outcome named `name`.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|outcome| outcome.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(words: &[&str]) -> Vec<Value> {
        words.iter().map(|w| Value::BulkString(w.as_bytes().to_vec())).collect()
    }

    #[test]
    fn script_answers_parse_and_unknown_words_are_protocol_errors() {
        assert_eq!(
            Dispatched::parse(&answer(&["exists", "failed"])).unwrap(),
            Dispatched::Exists(JobState::Failed)
        );
        assert_eq!(Dispatched::parse(&answer(&["stale", "17"])).unwrap(), Dispatched::Stale("17".into()));
        assert_eq!(Routed::parse(&answer(&["owner", "w3"])).unwrap(), Routed::Owner("w3".into()));
        assert_eq!(Assigned::parse(&answer(&["skip"])).unwrap(), Assigned::Done);
        assert_eq!(
            Join::parse(&[Value::BulkString(b"joined".to_vec()), Value::Int(4)]).unwrap(),
            Join::Member("4".into())
        );
        assert!(matches!(Dispatched::parse(&answer(&["sen"])), Err(Error::Protocol { op: "dispatch", .. })));
        assert!(matches!(Dispatched::parse(&answer(&["exists", "nope"])), Err(Error::Protocol { .. })));
        assert!(matches!(Routed::parse(&[]), Err(Error::Protocol { op: "route", .. })));
    }

    #[test]
    fn outcomes_round_trip_their_names() {
        for outcome in Outcome::ALL {
            assert_eq!(Outcome::parse(outcome.as_str()), Some(outcome));
        }
        assert_eq!(Outcome::parse("Started"), None);
    }
}
