//! The entries of an `XREAD`, `XREADGROUP` or `XAUTOCLAIM` reply, read
//! from the reply Redis sent.
//!
//! Readers run on every inbox and reply stream, so this is on the path of
//! every job. redis-rs's `StreamReadReply` clones the whole reply before
//! converting it, and builds a map per stream, per entry and per entry's
//! fields; walking the owned reply moves the ids out and looks up the two
//! or three fields of an entry in place. Sinks read the same way.

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
fn read_entries(reply: Value) -> Result<Vec<Entry>, String> {
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

/// Sends `cmd`, an `XREAD` or `XREADGROUP`, and reads the entries of its
/// reply; a reply of another shape is an error named `desc` (`"unexpected
/// XREAD reply"`), as one that does not parse.
pub(crate) async fn query(
    cmd: redis::Cmd,
    conn: &mut impl redis::aio::ConnectionLike,
    desc: &'static str,
) -> redis::RedisResult<Vec<Entry>> {
    let reply = cmd.query_async::<Value>(conn).await?;
    read_entries(reply).map_err(|what| unexpected(desc, what))
}

/// The error of a reply that did not fit: `desc` names the command's
/// reply (`"unexpected XREAD reply"`), `what` what did not fit.
pub(crate) fn unexpected(desc: &'static str, what: String) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, desc, what))
}

/// The cursor and the entries of an `XAUTOCLAIM` reply (`[cursor,
/// entries, deleted ids]`), oldest first. An entry deleted since it was
/// delivered comes as nil before Redis 7 and is skipped. `Err` names what
/// did not fit.
pub(crate) fn claimed_entries(reply: Value) -> Result<(String, Vec<Entry>), String> {
    let Value::Array(parts) = reply else {
        return Err(format!("an XAUTOCLAIM reply as {reply:?}"));
    };
    let mut parts = parts.into_iter();
    let cursor = id_of(parts.next(), "a cursor")?;
    let Some(Value::Array(entries)) = parts.next() else {
        return Err("an XAUTOCLAIM reply without entries".to_owned());
    };
    let entries = entries
        .into_iter()
        .filter(|entry| *entry != Value::Nil)
        .map(entry_of)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((cursor, entries))
}

fn entry_of(entry: Value) -> Result<Entry, String> {
    let Value::Array(parts) = entry else {
        return Err(format!("an entry as {entry:?}"));
    };
    let mut parts = parts.into_iter();
    let id = id_of(parts.next(), "an entry id")?;
    let fields = match parts.next() {
        Some(Value::Array(fields)) => fields,
        _ => Vec::new(),
    };
    Ok(Entry { id, fields })
}

/// A stream id in a reply; `what` names it in the error.
fn id_of(value: Option<Value>, what: &str) -> Result<String, String> {
    match value {
        Some(Value::BulkString(id)) => String::from_utf8(id).map_err(|_| format!("{what} that is not UTF-8")),
        Some(Value::SimpleString(id)) => Ok(id),
        other => Err(format!("{what} as {other:?}")),
    }
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

    #[test]
    fn claimed_entries_come_with_the_cursor_and_without_deleted_ones() {
        let reply = Value::Array(vec![
            bulk("5-0"),
            Value::Array(vec![
                entry("1-0", &["n", "emit", "p", "x"]),
                Value::Nil,
                entry("4-0", &["n", "emit"]),
            ]),
            Value::Array(vec![bulk("2-0")]),
        ]);
        let (cursor, claimed) = claimed_entries(reply).unwrap();
        assert_eq!(cursor, "5-0");
        let ids: Vec<&str> = claimed.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["1-0", "4-0"]);
        assert_eq!(claimed[0].events().unwrap()[0].payload, b"x");
        assert!(claimed_entries(Value::Nil).unwrap_err().contains("XAUTOCLAIM reply"));
        assert!(claimed_entries(Value::Array(vec![bulk("0-0")])).is_err());
    }
}
