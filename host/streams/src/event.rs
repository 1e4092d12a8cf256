//! Events as stored in a stream (fields `n` name, `p` payload, optional `t`
//! topic), and their defensive decoding.

use redis::Value;
use redis::streams::StreamId;

/// One event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The entry id (`<ms>-<seq>`), unique and increasing in its stream.
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

    /// Decodes an entry; `None` (the caller logs the id) when a field is
    /// missing or not text where text is required.
    pub(crate) fn decode(entry: &StreamId) -> Option<Self> {
        let name = text(entry.map.get("n")?)?;
        let payload = bytes(entry.map.get("p")?)?;
        let topic = match entry.map.get("t") {
            Some(value) => Some(text(value)?),
            None => None,
        };
        Some(Self { id: entry.id.clone(), name, topic, payload })
    }
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(text) => Some(text.clone().into_bytes()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    String::from_utf8(bytes(value)?).ok()
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

    #[test]
    fn created_at_comes_from_the_id() {
        let event = Event { id: "1700000000123-4".into(), name: "n".into(), topic: None, payload: vec![] };
        assert_eq!(event.created_at_ms(), 1_700_000_000_123);
    }
}
