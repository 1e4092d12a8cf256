//! Where a worker answers a node's dispatches on a pool read by doorbells:
//! the last id it added to each such stream, and its answers there as
//! plain commands (see [`Answered`]).

use std::collections::HashMap;

use redis::{Cmd, RedisResult, Value};

use super::Core;
use super::emits::{Reply, reply_cmd};

/// The id of the last entry a worker added to each stream where it
/// answers a node's dispatches (`replies.<node>.<worker>`, see
/// `core::replies`), as milliseconds and sequence number.
///
/// A ring carries the id of the entry before its entries: the reader
/// takes them from the ring only when it read up to that id, and reads the
/// stream otherwise. On these streams the worker is the writer of all but
/// a few entries (the node's first, and answers other workers give for a
/// start that moved), so it picks the ids of its answers (above the last
/// one it knows) and rings with plain commands, where elsewhere a script
/// reads the last id and adds the entry in one step. An entry another
/// writer added after the worker's last one makes the worker's `XADD`
/// fail (its id is not above the stream's last): the worker reads the
/// last id again and answers again. A ring that names an id before
/// another writer's entry is safe: that entry rang before it, on the same
/// channel, so the reader is past both.
#[derive(Debug, Default)]
pub(super) struct Answered {
    last: HashMap<String, (u64, u64)>,
}

impl Answered {
    /// Reads the last id of each stream of `replies` the worker has not
    /// answered on yet.
    pub(super) async fn learn(&mut self, core: &Core, replies: &[Reply]) -> RedisResult<()> {
        let mut unknown: Vec<&str> = Vec::new();
        for reply in replies {
            if !self.last.contains_key(&reply.stream) && !unknown.contains(&reply.stream.as_str()) {
                unknown.push(&reply.stream);
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for stream in &unknown {
            pipe.cmd("XREVRANGE").arg(*stream).arg("+").arg("-").arg("COUNT").arg(1);
        }
        let lasts: Vec<redis::streams::StreamRangeReply> = pipe.query_async(&mut core.conn.clone()).await?;
        for (stream, range) in unknown.into_iter().zip(lasts) {
            let last = range.ids.first().map_or((0, 0), |entry| {
                let (ms, seq, _) = pulse_streams::id_order(&entry.id);
                (ms, seq)
            });
            self.last.insert(stream.to_owned(), last);
        }
        Ok(())
    }

    /// The `XADD` of each of `replies` (with its stream), each with an id
    /// of its own above its stream's last, then one `SPUBLISH` per stream
    /// ringing its entries (see `pulse_streams::ReaderOptions::doorbell`).
    pub(super) fn ring<'a>(&mut self, replies: &'a [Reply]) -> (Vec<(&'a str, Cmd)>, Vec<Cmd>) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
        let mut adds = Vec::with_capacity(replies.len());
        // Each stream's ring, in the order of their first answers.
        let mut rings: Vec<(&str, Vec<u8>)> = Vec::new();
        for reply in replies {
            let last = self.last.entry(reply.stream.clone()).or_insert((0, 0));
            let at = match rings.iter().position(|(stream, _)| *stream == reply.stream) {
                Some(at) => at,
                None => {
                    let mut message = Vec::new();
                    pulse_rmap::push_netstring(&mut message, format!("{}-{}", last.0, last.1).as_bytes());
                    rings.push((&reply.stream, message));
                    rings.len() - 1
                }
            };
            *last = if now > last.0 { (now, 0) } else { (last.0, last.1 + 1) };
            let id = format!("{}-{}", last.0, last.1);
            let message = &mut rings[at].1;
            pulse_rmap::push_netstring(message, id.as_bytes());
            pulse_rmap::push_netstring(message, reply.name.as_bytes());
            pulse_rmap::push_netstring(message, &reply.payload);
            adds.push((reply.stream.as_str(), reply_cmd(reply, &id)));
        }
        let rings = rings
            .into_iter()
            .map(|(stream, message)| {
                let mut cmd = redis::cmd("SPUBLISH");
                cmd.arg(stream).arg(message);
                cmd
            })
            .collect();
        (adds, rings)
    }

    /// Forgets the last ids of the streams of `replies`, which a script
    /// added to.
    pub(super) fn forget(&mut self, replies: &[Reply]) {
        for reply in replies {
            self.last.remove(&reply.stream);
        }
    }

    /// Takes the answers of the pipeline's first `added.len()` commands,
    /// the `XADD`s of `added`'s streams: the streams whose `XADD` failed
    /// (another writer took the id, or the slot was moving), to answer on
    /// again (their last ids forgotten, to be read again). A stream that is
    /// gone (its node left) is forgotten too.
    pub(super) fn settle(&mut self, added: &[&str], answered: &[RedisResult<Value>]) -> Vec<String> {
        let mut again: Vec<String> = Vec::new();
        for (stream, answer) in added.iter().zip(answered) {
            match answer {
                Ok(Value::Nil) => {
                    self.last.remove(*stream);
                }
                Err(error) => {
                    tracing::debug!(stream, error = %error, "an answer was not added; answering again");
                    self.last.remove(*stream);
                    if !again.iter().any(|known| known == stream) {
                        again.push((*stream).to_owned());
                    }
                }
                Ok(_) => {}
            }
        }
        again
    }
}
