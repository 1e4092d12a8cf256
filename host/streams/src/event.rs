//! Events as stored in a stream, and their defensive decoding.
//!
//! An entry holds one event (fields `n` name, `p` payload, optional `t`
//! topic: what [`crate::Stream::add`] writes), or several sharing one
//! entry (fields `n` name, `b` batch: the netstrings of each event's
//! topic and payload, in order; `k` their count, for scripts that trim
//! without decoding them). Events that share an entry share its name, and
//! each has an id of its own: `<entry id>.<index>`, the first index 0.

use redis::Value;
use redis::streams::StreamId;

/// One event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its id, unique and increasing in its stream: its entry's id
    /// (`<ms>-<seq>`), or `<ms>-<seq>.<index>` for one of the events that
    /// share an entry. Compare ids with [`crate::id_after`].
    pub id: String,
    /// The event's name.
    pub name: String,
    /// The event's topic, if it has one.
    pub topic: Option<String>,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Event {
    /// When Redis added the event, in ms since the Unix epoch (from its id).
    pub fn created_at_ms(&self) -> u64 {
        self.id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0)
    }

    /// The events of stream entry `entry`, in order; `None` (the caller
    /// logs the id) when a field is missing or not text where text is
    /// required, or a batch is not a whole number of netstring pairs.
    pub fn from_entry(entry: &StreamId) -> Option<Vec<Self>> {
        Self::from_fields(&entry.id, |name| entry.map.get(name))
    }

    /// The events of the entry with id `id` whose fields `field` looks up
    /// by name (see [`Event::from_entry`]).
    pub(crate) fn from_fields<'a>(id: &str, field: impl Fn(&str) -> Option<&'a Value>) -> Option<Vec<Self>> {
        let name = text(field("n")?)?;
        if let Some(batch) = field("b") {
            let batch = bytes_of(batch)?;
            let fields = pulse_rmap::netstrings(batch)?;
            if fields.len() % 2 != 0 {
                return None;
            }
            return fields
                .chunks(2)
                .enumerate()
                .map(|(index, event)| {
                    Some(Self {
                        id: format!("{id}.{index}"),
                        name: name.clone(),
                        topic: Some(String::from_utf8(event[0].to_vec()).ok()?),
                        payload: event[1].to_vec(),
                    })
                })
                .collect();
        }
        let payload = bytes_of(field("p")?)?.to_vec();
        let topic = match field("t") {
            Some(value) => Some(text(value)?),
            None => None,
        };
        Some(vec![Self { id: id.to_owned(), name, topic, payload }])
    }
}

pub(crate) fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    String::from_utf8(bytes_of(value)?.to_vec()).ok()
}

/// Which events a reader or sink passes on, by topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TopicFilter {
    /// Every event.
    #[default]
    All,
    /// Events whose topic is exactly this.
    Exact(String),
    /// Events whose topic matches this pattern: `*` matches any run of
    /// characters, `?` any one character, everything else itself.
    Pattern(String),
}

impl TopicFilter {
    /// Whether `event` passes.
    pub fn accepts(&self, event: &Event) -> bool {
        match self {
            TopicFilter::All => true,
            TopicFilter::Exact(topic) => event.topic.as_deref() == Some(topic.as_str()),
            TopicFilter::Pattern(pattern) => event.topic.as_deref().is_some_and(|topic| glob(pattern, topic)),
        }
    }
}

/// Glob matching with `*` and `?`, iterative (no backtracking blow-up).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_stars_and_question_marks() {
        for (pattern, text, expected) in [
            ("orders.*", "orders.created", true),
            ("orders.*", "orders", false),
            ("*.created", "orders.created", true),
            ("o?ders", "orders", true),
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("exact", "exact", true),
        ] {
            assert_eq!(glob(pattern, text), expected, "{pattern} vs {text}");
        }
    }

    fn entry(id: &str, fields: &[(&str, &[u8])]) -> StreamId {
        let map = fields.iter().map(|(f, v)| ((*f).to_owned(), Value::BulkString(v.to_vec()))).collect();
        StreamId { id: id.to_owned(), map, ..StreamId::default() }
    }

    #[test]
    fn an_entry_holds_one_event_or_several_each_with_an_id_of_its_own() {
        let one = Event::from_entry(&entry("7-1", &[("n", b"emit"), ("p", b"ab"), ("t", b"k")])).unwrap();
        assert_eq!(
            one,
            [Event {
                id: "7-1".into(),
                name: "emit".into(),
                topic: Some("k".into()),
                payload: b"ab".to_vec()
            }]
        );
        let batch = b"1:a,2:xy,1:b,0:,";
        let shared = Event::from_entry(&entry("7-2", &[("n", b"emit"), ("b", batch), ("k", b"2")])).unwrap();
        let got: Vec<(&str, Option<&str>, &[u8])> =
            shared.iter().map(|e| (e.id.as_str(), e.topic.as_deref(), e.payload.as_slice())).collect();
        assert_eq!(got, [("7-2.0", Some("a"), &b"xy"[..]), ("7-2.1", Some("b"), &b""[..])]);
        assert!(shared.iter().all(|e| e.name == "emit" && e.created_at_ms() == 7));
        for malformed in [&b"1:a,"[..], b"1:a,5:xy,", b"x"] {
            assert_eq!(Event::from_entry(&entry("7-3", &[("n", b"emit"), ("b", malformed)])), None);
        }
        assert_eq!(Event::from_entry(&entry("7-4", &[("p", b"no name")])), None);
    }

    #[test]
    fn created_at_comes_from_the_id() {
        let event = Event { id: "1700000000123-4".into(), name: "n".into(), topic: None, payload: vec![] };
        assert_eq!(event.created_at_ms(), 1_700_000_000_123);
    }
}
