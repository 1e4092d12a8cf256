//! The messages of inboxes and reply streams: netstring fields (as the
//! scripts write them with `ns()`), binary-safe, with the netstring codec
//! of `pulse-rmap` (the twin of the Lua library's `ns` and `netstrings`).

use pulse_rmap::{netstrings as fields, push_netstring as push};

/// An event of a worker's inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InboxEvent {
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) seq: u64,
    /// Where to answer (empty: nobody waits).
    pub(crate) reply: String,
    pub(crate) request: String,
    /// The W3C `traceparent` of the span that sent it (a dispatch or a
    /// notification), when its sender traced it; empty otherwise.
    pub(crate) trace: String,
    /// A notification's: the `traceparent` of the dispatch that started
    /// the job, when both were traced; empty otherwise.
    pub(crate) started_by: String,
}

/// What an inbox event asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Start {
        attempt: u32,
        requeued: bool,
        /// `None`: the event's own time.
        created_at_ms: Option<u64>,
        payload: Vec<u8>,
        state: Option<Vec<u8>>,
    },
    Stop,
    Notify {
        payload: Vec<u8>,
    },
}

impl InboxEvent {
    /// Decodes an inbox entry's name and payload. Fields after the ones
    /// it knows are ignored, and the trace fields may be absent (entries
    /// of earlier versions end before them).
    pub(crate) fn decode(name: &str, payload: &[u8]) -> Option<Self> {
        let f = fields(payload)?;
        // Read in place: only the fields the event keeps are copied.
        let field = |i: usize| text_of(f.get(i)?);
        let text = |i: usize| -> Option<String> { field(i).map(str::to_owned) };
        let number = |i: usize| -> Option<u64> { field(i)?.parse().ok() };
        let optional = |i: usize| field(i).unwrap_or_default();
        let (trace, started_by) = match name {
            "start" => (optional(11), ""),
            "notify" => (optional(6), optional(7)),
            _ => ("", ""),
        };
        let kind = match name {
            "start" => Kind::Start {
                attempt: u32::try_from(number(5)?).ok()?,
                requeued: field(6)? == "1",
                created_at_ms: if f.get(7)?.is_empty() { None } else { Some(number(7)?) },
                payload: f.get(8)?.to_vec(),
                state: if field(9)? == "1" { Some(f.get(10)?.to_vec()) } else { None },
            },
            "stop" => Kind::Stop,
            "notify" => Kind::Notify { payload: f.get(5)?.to_vec() },
            _ => return None,
        };
        Some(Self {
            kind,
            key: text(0)?,
            token: text(1)?,
            seq: number(2)?,
            reply: text(3)?,
            request: text(4)?,
            trace: trace.to_owned(),
            started_by: started_by.to_owned(),
        })
    }
}

/// The first character of the request ids of a node that reads answers
/// in batches: an [`ANSWERS`] entry holds every answer of a worker's flush
/// to that node. Request ids of nodes that do not (earlier versions make
/// bare ULIDs, which never hold it) get one entry per answer, so workers
/// and nodes of two versions work side by side during an upgrade.
pub(crate) const BATCHED: char = '+';

/// The name of a reply stream entry holding many answers.
pub(crate) const ANSWERS: &str = "answers";

/// Whether the node that made `request` reads [`ANSWERS`] entries.
pub(crate) fn reads_batches(request: &str) -> bool {
    request.starts_with(BATCHED)
}

/// `event` (a stop or notification) as the job's held events keep it
/// (`held_event` of the scripts): kind, reply stream, request, payload;
/// `None` for a start.
pub(crate) fn encode_held(event: &InboxEvent) -> Option<Vec<u8>> {
    let (kind, payload): (&str, &[u8]) = match &event.kind {
        Kind::Start { .. } => return None,
        Kind::Stop => ("stop", b""),
        Kind::Notify { payload } => ("notify", payload),
    };
    let mut out = Vec::new();
    push(&mut out, kind.as_bytes());
    push(&mut out, event.reply.as_bytes());
    push(&mut out, event.request.as_bytes());
    push(&mut out, payload);
    Some(out)
}

/// A worker's answer, on the dispatcher's reply stream: name = outcome,
/// payload = request id, message.
pub(crate) fn encode_reply(request: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    push(&mut out, request.as_bytes());
    push(&mut out, message.as_bytes());
    out
}

/// Appends one answer to the payload of an [`ANSWERS`] entry: outcome,
/// request id, message.
pub(crate) fn push_answer(out: &mut Vec<u8>, outcome: &str, request: &str, message: &str) {
    push(out, outcome.as_bytes());
    push(out, request.as_bytes());
    push(out, message.as_bytes());
}

/// The answers of an [`ANSWERS`] entry: (outcome, request id, message),
/// in order, read in place; `None` when it is malformed.
pub(crate) fn decode_answers(payload: &[u8]) -> Option<Vec<(&str, &str, &str)>> {
    let f = fields(payload)?;
    if f.len() % 3 != 0 {
        return None;
    }
    f.chunks(3).map(|a| Some((text_of(a[0])?, text_of(a[1])?, text_of(a[2])?))).collect()
}

/// Decodes a reply's payload into (request id, message), read in place.
pub(crate) fn decode_reply(payload: &[u8]) -> Option<(&str, &str)> {
    let f = fields(payload)?;
    Some((text_of(f.first()?)?, text_of(f.get(1)?)?))
}

/// A field as text, in place; `None` when it is not UTF-8.
fn text_of(field: &[u8]) -> Option<&str> {
    std::str::from_utf8(field).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbox_events_decode_as_the_scripts_write_them() {
        let mut p = Vec::new();
        for field in [&b"k"[..], b"7", b"0", b"r", b"q", b"1", b"0", b"", b"\x00bin", b"1", b"st"] {
            push(&mut p, field);
        }
        let event = InboxEvent::decode("start", &p).unwrap();
        assert_eq!(event.key, "k");
        assert_eq!(event.token, "7");
        assert_eq!(
            event.kind,
            Kind::Start {
                attempt: 1,
                requeued: false,
                created_at_ms: None,
                payload: b"\x00bin".to_vec(),
                state: Some(b"st".to_vec())
            }
        );
        assert_eq!(event.trace, "", "a start of an earlier version: no trace field");
        push(&mut p, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let traced = InboxEvent::decode("start", &p).unwrap();
        assert_eq!(traced.trace, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        assert_eq!(traced.kind, event.kind);
        assert_eq!(InboxEvent::decode("start", b"1:k,"), None);
        assert_eq!(InboxEvent::decode("bogus", &p), None);
        assert_eq!(decode_reply(&encode_reply("r1", "hi")), Some(("r1", "hi")));
    }

    #[test]
    fn batched_answers_decode_in_order_and_only_whole() {
        let mut p = Vec::new();
        push_answer(&mut p, "started", "+r1", "");
        push_answer(&mut p, "refused", "+r2", "bad input, with a comma");
        assert_eq!(
            decode_answers(&p),
            Some(vec![("started", "+r1", ""), ("refused", "+r2", "bad input, with a comma")])
        );
        push(&mut p, b"started");
        assert_eq!(decode_answers(&p), None, "an answer cut short");
        assert!(reads_batches("+01J"));
        assert!(!reads_batches("01J"), "a bare ULID: a node answered one entry per answer");
    }
}
