//! The entries of an `XREAD` reply, read from the reply Redis sent.
//!
//! Readers run on every inbox and reply stream, so this is on the path of
//! every job. redis-rs's `StreamReadReply` clones the whole reply before
//! converting it, and builds a map per stream, per entry and per entry's
//! fields; walking the owned reply moves the ids out and looks up the two
//! or three fields of an entry in place.

use redis::Value;

use crate::event::{Event, bytes_of};

/// One stream entry: its id, and its field names and values in turn.
#[derive(Debug, PartialEq)]
pub(crate) struct Entry {
    pub(crate) id: String,
    fields: Vec<Value>,
}

impl Entry {
    /// The events the entry holds (see [`Event::from_fields`]); `None` when
    /// it is malformed.
    pub(crate) fn events(&self) -> Option<Vec<Event>> {
        Event::from_fields(&self.id, |name| {
            self.fields
                .chunks_exact(2)
                .find(|pair| bytes_of(&pair[0]) == Some(name.as_bytes()))
                .map(|pair| &pair[1])
        })
    }
}

/// The entries of an `XREAD` reply for one stream, oldest first: none for
/// nil (nothing new), else RESP2's `[[key, entries]]` or RESP3's
/// `{key: entries}`. An entry whose fields are not an array keeps its id
/// with no fields (its events are malformed, and the reader moves past
/// it). `Err` names what did not fit.
pub(crate) fn read_entries(reply: Value) -> Result<Vec<Entry>, String> {
    let streams = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|stream| match stream {
                Value::Array(pair) => {
                    pair.into_iter().nth(1).ok_or_else(|| "a stream without entries".to_owned())
                }
                other => Err(format!("a stream as {other:?}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        other => return Err(format!("an XREAD reply as {other:?}")),
    };
    let mut read = Vec::new();
    for entries in streams {
        let Value::Array(entries) = entries else {
            return Err(format!("entries as {entries:?}"));
        };
        read.reserve(entries.len());
        for entry in entries {
            read.push(entry_of(entry)?);
        }
    }
    Ok(read)
}

fn entry_of(entry: Value) -> Result<Entry, String> {
    let Value::Array(parts) = entry else {
        return Err(format!("an entry as {entry:?}"));
    };
    let mut parts = parts.into_iter();
    let id = match parts.next() {
        Some(Value::BulkString(id)) => {
            String::from_utf8(id).map_err(|_| "an entry id that is not UTF-8".to_owned())?
        }
        Some(Value::SimpleString(id)) => id,
        other => return Err(format!("an entry id as {other:?}")),
    };
    let fields = match parts.next() {
        Some(Value::Array(fields)) => fields,
        _ => Vec::new(),
    };
    Ok(Entry { id, fields })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![bulk(id), Value::Array(fields.iter().map(|f| bulk(f)).collect())])
    }

    #[test]
    fn entries_are_read_from_either_protocol_in_order() {
        let entries = Value::Array(vec![
            entry("1-0", &["n", "start", "p", "ab"]),
            entry("2-0", &["n", "stop", "p", ""]),
        ]);
        let resp2 = Value::Array(vec![Value::Array(vec![bulk("inbox"), entries.clone()])]);
        let resp3 = Value::Map(vec![(bulk("inbox"), entries)]);
        for reply in [resp2, resp3] {
            let read = read_entries(reply).unwrap();
            let ids: Vec<&str> = read.iter().map(|e| e.id.as_str()).collect();
            assert_eq!(ids, ["1-0", "2-0"]);
            let events = read[0].events().unwrap();
            assert_eq!((events[0].name.as_str(), events[0].payload.as_slice()), ("start", &b"ab"[..]));
            assert_eq!(events[0].id, "1-0");
        }
        assert_eq!(read_entries(Value::Nil).unwrap(), []);
    }

    #[test]
    fn a_malformed_entry_keeps_its_id_and_a_malformed_reply_is_an_error() {
        let odd = Value::Array(vec![bulk("3-0"), Value::Int(7)]);
        let reply = Value::Array(vec![Value::Array(vec![bulk("inbox"), Value::Array(vec![odd])])]);
        let read = read_entries(reply).unwrap();
        assert_eq!(read[0].id, "3-0");
        assert_eq!(read[0].events(), None);
        assert!(read_entries(Value::Int(1)).unwrap_err().contains("XREAD reply"));
        assert!(read_entries(Value::Array(vec![Value::Array(vec![bulk("inbox")])])).is_err());
    }
}
