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
    /// Decodes an inbox entry's name and payload.
    pub(crate) fn decode(name: &str, payload: &[u8]) -> Option<Self> {
        let f = fields(payload)?;
        let text = |i: usize| -> Option<String> { String::from_utf8(f.get(i)?.to_vec()).ok() };
        let number = |i: usize| -> Option<u64> { text(i)?.parse().ok() };
        let kind = match name {
            "start" => Kind::Start {
                attempt: u32::try_from(number(5)?).ok()?,
                requeued: text(6)? == "1",
                created_at_ms: if f.get(7)?.is_empty() { None } else { Some(number(7)?) },
                payload: f.get(8)?.to_vec(),
                state: if text(9)? == "1" { Some(f.get(10)?.to_vec()) } else { None },
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
        })
    }
}

/// A worker's answer, on the dispatcher's reply stream: name = outcome,
/// payload = request id, message.
pub(crate) fn encode_reply(request: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    push(&mut out, request.as_bytes());
    push(&mut out, message.as_bytes());
    out
}

/// Decodes a reply's payload into (request id, message).
pub(crate) fn decode_reply(payload: &[u8]) -> Option<(String, String)> {
    let f = fields(payload)?;
    Some((String::from_utf8(f.first()?.to_vec()).ok()?, String::from_utf8(f.get(1)?.to_vec()).ok()?))
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
        assert_eq!(InboxEvent::decode("start", b"1:k,"), None);
        assert_eq!(InboxEvent::decode("bogus", &p), None);
        assert_eq!(decode_reply(&encode_reply("r1", "hi")), Some(("r1".into(), "hi".into())));
    }
}
