//! A worker's writes in its jobs' names on their way to Redis: the events
//! its jobs emit, the states they save and their completions, with the
//! answers to their calls and the deletion of the inbox entries processed.
//!
//! [`crate::JobContext::emit`] does not wait for Redis. After the checks it
//! can make at once (the size, the worker's fence, no loss of the pool's
//! data pending) the event joins its worker's queue, and the call goes on.
//! While a call of the job runs (a handler call the worker made, or a
//! timer's call the runtime made, see [`crate::JobContext::call_scope`]),
//! `save_state` and `complete` join the queue too.
//!
//! **One step per call.** The writes of a call wait in the queue until the
//! call ends. Then they are written in one script call (`write.lua`) with
//! the answer to the call and the deletion of its inbox entry, or none of
//! them is: a host killed between two writes of one call could otherwise
//! leave a state saved without the event emitted with it, and the job's
//! next run would resume past a count nobody saw. So an emit costs no round
//! trip of its own, and the writes of many calls share one script call;
//! the events of one script call share entries of the events stream
//! ([`cut`] makes them, see `write.lua`).
//!
//! Order: every write made in the name of a worker's jobs outside a call
//! (a failure, a hand-back, a completion after a stop) sends what is
//! queued for its job first, in the same pipeline, and one batch is sent
//! at a time. So each job's writes reach Redis in the order it made them.
//! A worker's flush may carry other workers' batches (see `flushes`): one
//! pipeline, one `write.lua` for all their writes, each worker's batch
//! still taken and answered in its own order.
//!
//! Fencing: each write is made under its job's token in `write.lua`, and
//! one whose job is no longer its worker's when the batch arrives is
//! dropped (an event is counted in `pulse_emits_dropped_total`), as it
//! would have been refused. A batch cut off by a dropped connection is
//! sent again, so it may be written twice. A batch that meets Redis
//! without its script (after a restart or `SCRIPT FLUSH`) wrote nothing:
//! the script is loaded and the batch sent again, after the commands that
//! went with it (each worker loads it when it starts).
//!
//! Bound: the queue holds [`QUEUE_BYTES`] of payload; a write that finds
//! it fuller is written at once, with what is queued, and with the writes
//! its call made so far: that one call's writes then land in more than one
//! step, still in order.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::{Cmd, RedisResult, Value};
use tokio::sync::Notify;

use super::Core;
use super::answered::Answered;
use crate::{scripts, wire};

/// Payload bytes a worker's queue holds, at most, before a write is sent
/// at once with everything queued.
pub(super) const QUEUE_BYTES: usize = 4 << 20;

/// Entries kept in a node's reply stream (approximately): answers older
/// than that have no waiter any more.
const REPLIES_KEPT: usize = 10_000;

/// What a call wrote.
#[derive(Debug)]
pub(crate) enum What {
    /// An event emitted, with its payload.
    Event(Vec<u8>),
    /// The job's state, saved.
    State(Vec<u8>),
    /// The job completed: removed from the pool.
    Finish,
}

impl What {
    fn kind(&self) -> &'static str {
        match self {
            What::Event(_) => "e",
            What::State(_) => "s",
            What::Finish => "f",
        }
    }

    fn payload(&self) -> &[u8] {
        match self {
            What::Event(payload) | What::State(payload) => payload,
            What::Finish => b"",
        }
    }
}

/// A write waiting to be sent.
#[derive(Debug)]
pub(crate) struct Write {
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) what: What,
}

/// An answer to a request, waiting to be sent.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub(crate) stream: String,
    pub(crate) outcome: super::Outcome,
    pub(crate) request: String,
    pub(crate) message: String,
}

/// An entry for a reply stream: one answer, or the answers of a batch.
#[derive(Debug)]
pub(super) struct Reply {
    pub(crate) stream: String,
    /// The entry's name: an outcome, or the batch of answers.
    pub(crate) name: &'static str,
    pub(crate) payload: Vec<u8>,
}

/// What one pipeline writes: the queued writes of calls that ended, the
/// answers and the inbox entries to delete.
#[derive(Default)]
struct Batch {
    writes: Vec<Write>,
    answers: Vec<Outgoing>,
    deletes: Vec<String>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.answers.is_empty() && self.deletes.is_empty()
    }
}

/// The queue itself. No operation walks it: a call's writes wait with
/// their call in `open` and join `sealed` when it ends, so each write costs
/// the same whatever the queue holds (up to [`QUEUE_BYTES`] of small
/// events, when Redis is slow to take them).
#[derive(Default)]
struct Pending {
    /// The writes of calls that ended (or of none), in the order they
    /// joined: only these are sent. A job's writes join in the order it
    /// made them.
    sealed: VecDeque<Write>,
    answers: Vec<Outgoing>,
    deletes: Vec<String>,
    /// Payload bytes of every write held, sealed or not.
    bytes: usize,
    /// The calls running, by job, with the writes they made so far.
    open: HashMap<String, Open>,
    /// Writes held in `open`.
    unsealed: usize,
    /// Batches taken from the queue and not yet answered.
    in_flight: usize,
}

/// A job's running calls and their writes, which wait for their end.
#[derive(Default)]
struct Open {
    calls: usize,
    writes: Vec<Write>,
}

impl Pending {
    /// A call (or scope) of job `key` ended, with its answers and inbox
    /// entry: its writes are sealed once its last scope ended.
    fn end(&mut self, key: &str, answers: Vec<Outgoing>, entry: Option<String>) {
        if let Some(open) = self.open.get_mut(key) {
            open.calls -= 1;
            if open.calls == 0 {
                self.seal(key);
                self.open.remove(key);
            }
        }
        self.answers.extend(answers);
        self.deletes.extend(entry);
    }

    /// The writes job `key`'s calls made so far are sent with the next batch.
    fn seal(&mut self, key: &str) {
        if let Some(open) = self.open.get_mut(key) {
            self.unsealed -= open.writes.len();
            self.sealed.extend(open.writes.drain(..));
        }
    }

    /// Queues `write`: sealed at once unless a call of its job runs;
    /// whether it was.
    fn push(&mut self, write: Write) -> bool {
        self.bytes += write.what.payload().len();
        match self.open.get_mut(&write.key) {
            Some(open) => {
                open.writes.push(write);
                self.unsealed += 1;
                false
            }
            None => {
                self.sealed.push_back(write);
                true
            }
        }
    }

    /// Job `key`'s running calls and their writes are forgotten.
    fn discard(&mut self, key: &str) {
        if let Some(open) = self.open.remove(key) {
            self.unsealed -= open.writes.len();
            self.bytes -= payload_bytes(&open.writes);
        }
    }

    fn has_sealed(&self) -> bool {
        !self.answers.is_empty() || !self.deletes.is_empty() || !self.sealed.is_empty()
    }

    fn take(&mut self) -> Batch {
        let writes: Vec<Write> = self.sealed.drain(..).collect();
        self.bytes -= payload_bytes(&writes);
        Batch {
            writes,
            answers: std::mem::take(&mut self.answers),
            deletes: std::mem::take(&mut self.deletes),
        }
    }

    fn put_back(&mut self, batch: Batch) {
        self.bytes += payload_bytes(&batch.writes);
        for write in batch.writes.into_iter().rev() {
            self.sealed.push_front(write);
        }
        let mut answers = batch.answers;
        answers.append(&mut self.answers);
        self.answers = answers;
        let mut deletes = batch.deletes;
        deletes.append(&mut self.deletes);
        self.deletes = deletes;
    }
}

/// The payload bytes of `writes`, as [`Pending::bytes`] counts them.
fn payload_bytes(writes: &[Write]) -> usize {
    writes.iter().map(|write| write.what.payload().len()).sum()
}

/// One worker's queue of writes (see the module's docs).
pub(crate) struct EmitQueue {
    /// The worker whose jobs write them.
    worker: String,
    pending: Mutex<Pending>,
    /// Held from taking a batch until its pipeline is answered: batches
    /// reach Redis in the order they were taken. It holds the id of the
    /// last entry the worker added to each stream where it answers
    /// dispatches (see [`Answered`]).
    sending: tokio::sync::Mutex<Answered>,
    /// Told of each write ready to send: the worker writes those no answer
    /// will carry (made from a timer) without waiting.
    queued: Notify,
}

/// A call of one job running (see [`crate::JobContext::call_scope`]): its
/// writes wait in the queue until it is dropped.
pub struct CallScope {
    queue: Arc<EmitQueue>,
    key: String,
}

impl std::fmt::Debug for CallScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallScope").field("key", &self.key).finish_non_exhaustive()
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        self.queue.end_scope(&self.key);
    }
}

impl EmitQueue {
    pub(crate) fn new(worker: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            pending: Mutex::default(),
            sending: tokio::sync::Mutex::default(),
            queued: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Held for a queue operation, never across an await.
        self.pending.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// A call of job `key` begins: its writes wait until it ends.
    pub(crate) fn begin(&self, key: &str) {
        self.lock().open.entry(key.to_owned()).or_default().calls += 1;
    }

    /// [`Self::begin`], ended when the scope is dropped.
    pub(crate) fn scope(self: &Arc<Self>, key: &str) -> CallScope {
        self.begin(key);
        CallScope { queue: self.clone(), key: key.to_owned() }
    }

    /// A call of job `key` that the worker made ended: its writes are sent
    /// with the next batch, with `replies` and the deletion of inbox entry
    /// `entry` (when the call's last scope ended: in one step with them).
    /// The worker flushes after every call it applies, so nothing wakes it.
    pub(crate) fn end(&self, key: &str, answers: Vec<Outgoing>, entry: Option<String>) {
        self.lock().end(key, answers, entry);
    }

    /// A scope the runtime opened (a timer's call) ended: its writes wait
    /// for no answer of the worker's, so the worker is woken to send them.
    fn end_scope(&self, key: &str) {
        let mut pending = self.lock();
        pending.end(key, Vec::new(), None);
        let ready = pending.has_sealed();
        drop(pending);
        if ready {
            self.queued.notify_one();
        }
    }

    /// A call of job `key` ended after its job may have moved: nothing it
    /// wrote is sent, and no scope of it is open any more.
    pub(crate) fn discard(&self, key: &str) {
        self.lock().discard(key);
    }

    /// Whether a call of job `key` runs.
    pub(crate) fn in_call(&self, key: &str) -> bool {
        self.lock().open.contains_key(key)
    }

    /// Answers and inbox entries to delete with the next batch.
    pub(crate) fn answer(&self, answers: Vec<Outgoing>, deletes: Vec<String>) {
        let mut pending = self.lock();
        pending.answers.extend(answers);
        pending.deletes.extend(deletes);
    }

    /// Queues `write`, to be sent when its call ends (at once if none
    /// runs). True when the queue holds more than [`QUEUE_BYTES`] now:
    /// then the caller sends it with [`Self::send_now`].
    pub(crate) fn push(&self, write: Write) -> bool {
        let mut pending = self.lock();
        let sealed = pending.push(write);
        let full = pending.bytes > QUEUE_BYTES;
        drop(pending);
        if sealed {
            self.queued.notify_one();
        }
        full
    }

    /// Sends what is queued now, with the writes job `key`'s call made so
    /// far (the queue is full).
    pub(crate) async fn send_now(&self, core: &Core, key: &str) -> RedisResult<()> {
        self.lock().seal(key);
        self.send(core, &[]).await.map(drop)
    }

    /// How many answers, deletions and writes wait to be sent.
    pub(crate) fn backlog(&self) -> usize {
        let pending = self.lock();
        pending.answers.len() + pending.deletes.len() + pending.sealed.len() + pending.unsealed
    }

    /// Whether something waits to be sent.
    pub(crate) fn has_ready(&self) -> bool {
        self.lock().has_sealed()
    }

    /// The payload bytes of the writes it holds, ready or not.
    pub(super) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Whether writes of its jobs wait to be sent (not only answers and
    /// deletions): a flush of them runs `write.lua`.
    pub(crate) fn has_writes_ready(&self) -> bool {
        !self.lock().sealed.is_empty()
    }

    /// Resolves once a write was ready since the last time it resolved.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn queued(&self) {
        self.queued.notified().await;
    }

    /// Writes what is ready (the writes of ended calls, answers, inbox
    /// deletions), then `then`, in one pipeline and in that order; returns
    /// the answers to `then`'s commands. A batch that did not reach Redis
    /// goes back to the front of the queue.
    ///
    /// # Cancel safety
    /// Not cancel safe: a batch taken is written, or put back, only if the
    /// future runs to its end.
    pub(crate) async fn send(&self, core: &Core, then: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        let mut parts = [self.part().await];
        let result = write(core, &mut parts, then).await;
        let [part] = parts;
        part.settle(result.is_err());
        result
    }

    /// What the queue has ready, once its earlier batches were answered:
    /// its part of the next pipeline.
    async fn part(&self) -> Part<'_> {
        let answered = self.sending.lock().await;
        let batch = {
            let mut pending = self.lock();
            pending.in_flight += 1;
            pending.take()
        };
        Part { queue: self, batch, answered }
    }

    /// Sends `cmd`, an [`scripts::evalsha`] of `script` for job `key`,
    /// after what is ready and the writes the job made so far; alone when
    /// nothing is queued or being written.
    pub(crate) async fn ordered<T: redis::FromRedisValue>(
        &self,
        core: &Core,
        key: &str,
        script: &redis::Script,
        cmd: Cmd,
    ) -> RedisResult<T> {
        let quiet = {
            let mut pending = self.lock();
            pending.seal(key);
            !pending.has_sealed() && pending.in_flight == 0
        };
        if quiet {
            return scripts::query(script, &cmd, &mut core.conn.clone()).await;
        }
        match self.send(core, std::slice::from_ref(&cmd)).await?.pop() {
            Some(Ok(value)) => Ok(redis::from_redis_value(value)?),
            // What went before it was written: sending it again alone
            // keeps the order.
            Some(Err(error)) if scripts::is_unknown_script(&error) => {
                scripts::query(script, &cmd, &mut core.conn.clone()).await
            }
            Some(Err(error)) => Err(error),
            None => unreachable!("one command sent, one answer"),
        }
    }

    /// Puts the answers to `streams` back in the queue, to be sent again
    /// (see [`Answered::settle`]), and wakes the worker to send them.
    fn answer_again(&self, answers: &[Outgoing], streams: &[String]) {
        let mut pending = self.lock();
        pending.answers.extend(answers.iter().filter(|out| streams.contains(&out.stream)).cloned());
        drop(pending);
        self.queued.notify_one();
    }

    /// Writes `write` now, after what is ready and its job's writes so
    /// far; whether Redis took it (its token is its job's).
    pub(crate) async fn write_now(&self, core: &Core, write: Write) -> RedisResult<bool> {
        let key = write.key.clone();
        let batch = Batch { writes: vec![write], ..Batch::default() };
        let cmd = write_cmd(core, &[(&self.worker, &batch, &[])]);
        let flags: String = self.ordered(core, &key, &scripts::WRITE, cmd).await?;
        Ok(written_flags(&flags).next() == Some(true))
    }
}

/// A worker's part of a pipeline: what its queue had ready, and the ids
/// it answered with, held until the pipeline is answered (batches reach
/// Redis in the order they were taken).
struct Part<'a> {
    queue: &'a EmitQueue,
    batch: Batch,
    answered: tokio::sync::MutexGuard<'a, Answered>,
}

impl Part<'_> {
    /// The pipeline was answered, or (`failed`) did not reach Redis: the
    /// batch goes back to the front of its queue.
    fn settle(self, failed: bool) {
        let mut pending = self.queue.lock();
        pending.in_flight -= 1;
        if failed {
            pending.put_back(self.batch);
        }
    }
}

/// Writes what each of `queues` has ready in one pipeline, with one
/// `write.lua` for all of them whose writes need one (see `flushes`).
pub(super) async fn send_together(core: &Core, queues: &[Arc<EmitQueue>]) -> RedisResult<()> {
    let mut parts = Vec::with_capacity(queues.len());
    for queue in queues {
        parts.push(queue.part().await);
    }
    let result = write(core, &mut parts, &[]).await;
    let failed = result.is_err();
    for part in parts {
        part.settle(failed);
    }
    result.map(drop)
}

/// Writes `parts`, then `then`, in one pipeline: one `write.lua` for the
/// parts whose writes need it, plain commands for the others' answers
/// and deletions. Returns the answers to `then`'s commands.
async fn write(core: &Core, parts: &mut [Part<'_>], then: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
    if then.is_empty() && parts.iter().all(|part| part.batch.is_empty()) {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let replies: Vec<Vec<Reply>> = parts.iter().map(|part| replies(&part.batch.answers)).collect();
    // With doorbells, answers ring with their entries and the id before
    // them, which only a script knows; but on the streams where a worker
    // answers dispatches, it picks the ids itself.
    let scripted: Vec<bool> = parts
        .iter()
        .zip(&replies)
        .map(|(part, replies)| {
            let worker = &part.queue.worker;
            let plain =
                !core.doorbells || replies.iter().all(|reply| core.keys.answered_by(&reply.stream, worker));
            !part.batch.writes.is_empty() || (!plain && !part.batch.is_empty())
        })
        .collect();
    let script = scripted.contains(&true);
    if script {
        pipe.add_command(script_cmd(core, parts, &replies, &scripted));
    }
    // Each plain part: its index, the streams of its answers added with
    // their ids (in the order of their `XADD`s, which open its commands),
    // and how many commands it sent.
    let mut plain: Vec<(usize, Vec<&str>, usize)> = Vec::new();
    for (at, part) in parts.iter_mut().enumerate() {
        if scripted[at] {
            // The script picks the ids: the worker's last ones are not
            // the streams' last any more.
            part.answered.forget(&replies[at]);
            continue;
        }
        if part.batch.is_empty() {
            continue;
        }
        let (mut added, mut commands) = (Vec::new(), 0);
        if core.doorbells {
            part.answered.learn(core, &replies[at]).await?;
            let (adds, rings) = part.answered.ring(&replies[at]);
            for (stream, cmd) in adds {
                added.push(stream);
                pipe.add_command(cmd);
            }
            commands += added.len() + rings.len();
            for cmd in rings {
                pipe.add_command(cmd);
            }
        } else {
            for reply in &replies[at] {
                pipe.add_command(reply_cmd(reply, "*"));
                commands += 1;
            }
        }
        if !part.batch.deletes.is_empty() {
            // XDEL, not XTRIM MINID: entries are processed out of order
            // (calls of different keys finish in any order), and an exact
            // trim scans the head node of the stream on every call;
            // deleting an entry is a lookup.
            let mut cmd = redis::cmd("XDEL");
            cmd.arg(core.keys.inbox(&part.queue.worker)).arg(&part.batch.deletes);
            pipe.add_command(cmd);
            commands += 1;
        }
        plain.push((at, added, commands));
    }
    for cmd in then {
        pipe.add_command(cmd.clone());
    }
    let mut conn = core.conn.clone();
    let mut answered: Vec<RedisResult<Value>> = pipe.query_async(&mut conn).await?;
    let rest = answered.split_off(answered.len() - then.len());
    let mut answered = answered.into_iter();
    if script {
        let reply: RedisResult<String> = match answered.next() {
            // Redis forgot its scripts since the worker loaded them (a
            // restart, `SCRIPT FLUSH`): the script wrote nothing, and is
            // sent again, now after the rest of the pipeline.
            Some(Err(error)) if scripts::is_unknown_script(&error) => {
                let cmd = script_cmd(core, parts, &replies, &scripted);
                scripts::query(&scripts::WRITE, &cmd, &mut conn).await
            }
            Some(other) => other.and_then(|value| Ok(redis::from_redis_value(value)?)),
            None => unreachable!("one script sent, one answer"),
        };
        // The script's flags, a part's after another's, in order.
        let mut at = 0;
        for (part, _) in parts.iter().zip(&scripted).filter(|(_, scripted)| **scripted) {
            let items = part.batch.writes.len();
            let flags = reply.as_deref().map(|flags: &str| flags.get(at..at + items).unwrap_or_default());
            written(core, &part.batch.writes, flags);
            at += items;
        }
    }
    for (at, added, commands) in plain {
        let theirs: Vec<RedisResult<Value>> = answered.by_ref().take(commands).collect();
        let part = &mut parts[at];
        let again = part.answered.settle(&added, &theirs);
        if !again.is_empty() {
            // Not added (another writer took the id, or the slot was
            // moving): the stream's answers go again, after its last id
            // is read.
            part.queue.answer_again(&part.batch.answers, &again);
        }
        // Past the answers added with their ids, settled above.
        if let Some(Err(error)) = theirs.into_iter().skip(added.len()).find(Result::is_err) {
            tracing::warn!(error = %error, "failed to answer or to delete the entry from the inbox");
        }
    }
    Ok(rest)
}

/// The `write.lua` of the parts of `parts` that are `scripted`, with
/// their answers as `replies`.
fn script_cmd(core: &Core, parts: &[Part<'_>], replies: &[Vec<Reply>], scripted: &[bool]) -> Cmd {
    let writers: Vec<(&str, &Batch, &[Reply])> = parts
        .iter()
        .zip(replies)
        .zip(scripted)
        .filter(|(_, scripted)| **scripted)
        .map(|((part, replies), _)| (part.queue.worker.as_str(), &part.batch, replies.as_slice()))
        .collect();
    write_cmd(core, &writers)
}

/// `write.lua` for `writers`, each a worker with its batch and the answers
/// of its batch as replies.
fn write_cmd(core: &Core, writers: &[(&str, &Batch, &[Reply])]) -> Cmd {
    let keys = &core.keys;
    let mut names = vec![
        keys.jobs.clone(),
        keys.events.clone(),
        keys.events_written.clone(),
        keys.events_bytes_earlier.clone(),
        keys.events_count.clone(),
    ];
    for (worker, _, _) in writers {
        names.extend([keys.inbox(worker), keys.worker_jobs(worker)]);
    }
    let writes = || writers.iter().flat_map(|(_, batch, _)| &batch.writes);
    for write in writes() {
        match write.what {
            What::Event(_) => {}
            What::State(_) => names.push(keys.record(&write.key)),
            What::Finish => names.extend([keys.record(&write.key), keys.held(&write.key)]),
        }
    }
    let replies = || writers.iter().flat_map(|(_, _, replies)| replies.iter());
    names.extend(replies().map(|reply| reply.stream.clone()));
    let Cut { entries, counts } = cut(writes(), core.options.events_max_bytes);
    let mut cmd = scripts::evalsha(&scripts::WRITE, &names);
    cmd.arg(core.options.events_retention)
        .arg(core.options.events_max_bytes)
        .arg(writers.len())
        .arg(REPLIES_KEPT)
        .arg(writes().count())
        .arg(replies().count())
        .arg(core.ring())
        .arg(entries.len())
        .arg(&entries)
        .arg(&counts);
    for (_, batch, _) in writers {
        cmd.arg(batch.writes.len());
    }
    // The kinds, left empty when every item is an event (the script then
    // checks none).
    if writes().all(|write| matches!(write.what, What::Event(_))) {
        cmd.arg("");
    } else {
        cmd.arg(writes().map(|write| write.what.kind()).collect::<String>());
    }
    for write in writes() {
        cmd.arg(&write.key);
    }
    for (worker, batch, _) in writers {
        for write in &batch.writes {
            cmd.arg(format!("running|{worker}|{}|", write.token));
        }
    }
    for write in writes() {
        if let What::State(payload) = &write.what {
            cmd.arg(payload);
        }
    }
    for reply in replies() {
        cmd.arg(reply.name).arg(&reply.payload);
    }
    for (_, batch, _) in writers {
        cmd.arg(batch.deletes.len()).arg(&batch.deletes);
    }
    cmd
}

/// Events that share an entry of the events stream, at most (see
/// `write.lua`).
const EVENTS_PER_ENTRY: usize = 64;

/// The events of a batch cut into the entries of the events stream.
#[derive(Debug, Default)]
struct Cut {
    /// Each entry's batch: the netstrings of its events' keys and
    /// payloads.
    entries: Vec<Vec<u8>>,
    /// How many events each entry holds.
    counts: Vec<usize>,
}

/// The events of `writes` cut into entries of up to [`EVENTS_PER_ENTRY`]
/// events and a sixteenth of `max_bytes` (or one larger event).
fn cut<'a>(writes: impl Iterator<Item = &'a Write>, max_bytes: u64) -> Cut {
    let step = usize::try_from(max_bytes / 16).unwrap_or(usize::MAX).max(1);
    let mut cut = Cut::default();
    for write in writes {
        let What::Event(payload) = &write.what else { continue };
        let size = pulse_rmap::netstring_len(write.key.len()) + pulse_rmap::netstring_len(payload.len());
        let fits = cut
            .entries
            .last()
            .zip(cut.counts.last())
            .is_some_and(|(entry, count)| *count < EVENTS_PER_ENTRY && entry.len() + size <= step);
        if !fits {
            cut.entries.push(Vec::with_capacity(size));
            cut.counts.push(0);
        }
        let (entry, count) = cut.entries.last_mut().zip(cut.counts.last_mut()).expect("an entry");
        pulse_rmap::push_netstring(entry, write.key.as_bytes());
        pulse_rmap::push_netstring(entry, payload);
        *count += 1;
    }
    cut
}

/// The entries for `answers` on their reply streams: per reply stream,
/// one entry holding the answers to requests of a node that reads them in
/// batches, and one entry per answer to any other request.
fn replies(answers: &[Outgoing]) -> Vec<Reply> {
    let mut replies = Vec::new();
    // (stream, the payload of its `answers` entry), in order.
    let mut batches: Vec<(&str, Vec<u8>)> = Vec::new();
    for out in answers {
        if !wire::reads_batches(&out.request) {
            let payload = wire::encode_reply(&out.request, &out.message);
            replies.push(Reply { stream: out.stream.clone(), name: out.outcome.as_str(), payload });
            continue;
        }
        let at = match batches.iter().position(|(stream, _)| *stream == out.stream) {
            Some(at) => at,
            None => {
                batches.push((&out.stream, Vec::new()));
                batches.len() - 1
            }
        };
        wire::push_answer(&mut batches[at].1, out.outcome.as_str(), &out.request, &out.message);
    }
    for (stream, payload) in batches {
        replies.push(Reply { stream: stream.to_owned(), name: wire::ANSWERS, payload });
    }
    replies
}

/// An entry for `reply` on its reply stream, with id `id` (`*`: Redis
/// picks it).
pub(super) fn reply_cmd(reply: &Reply, id: &str) -> Cmd {
    // NOMKSTREAM: the answer to a node that is gone creates nothing.
    let mut cmd = redis::cmd("XADD");
    cmd.arg(&reply.stream)
        .arg("NOMKSTREAM")
        .arg("MAXLEN")
        .arg("~")
        .arg(REPLIES_KEPT)
        .arg(id)
        .arg("n")
        .arg(reply.name)
        .arg("p")
        .arg(&reply.payload);
    cmd
}

/// Whether each write of a batch was made, from `write.lua`'s answer:
/// one `1` (made) or `0` (refused) per write, in order.
pub(crate) fn written_flags(flags: &str) -> impl Iterator<Item = bool> + '_ {
    flags.bytes().map(|flag| flag == b'1')
}

/// Counts and logs the writes of `batch` that were not made, from their
/// flags in `write.lua`'s answer.
fn written(core: &Core, batch: &[Write], reply: Result<&str, &redis::RedisError>) {
    let events =
        |writes: &[Write]| writes.iter().filter(|write| matches!(write.what, What::Event(_))).count();
    match reply {
        Ok(flags) => {
            for (write, written) in batch.iter().zip(written_flags(flags)) {
                if !written {
                    tracing::debug!(job.key = %write.key, token = %write.token, kind = write.what.kind(), "dropped a write: the job is no longer this worker's");
                    if matches!(write.what, What::Event(_)) {
                        core.metrics.emits_dropped.increment(1);
                    }
                }
            }
        }
        Err(error) => {
            tracing::warn!(writes = batch.len(), error = %error, "failed to write what a worker's jobs wrote; it is dropped");
            core.metrics.emits_dropped.increment(events(batch) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(key: &str, size: usize) -> Write {
        Write { key: key.into(), token: "1".into(), what: What::Event(vec![b'x'; size]) }
    }

    fn keys(batch: &Batch) -> Vec<(&str, usize)> {
        batch.writes.iter().map(|write| (write.key.as_str(), write.what.payload().len())).collect()
    }

    #[test]
    fn a_call_s_writes_wait_for_its_end_and_each_job_s_keep_their_order() {
        let mut pending = Pending::default();
        pending.open.entry("a".into()).or_default().calls += 2; // a call and a timer's scope
        assert!(!pending.push(event("a", 1)));
        assert!(pending.push(event("b", 2))); // no call of b runs: sealed at once
        assert!(!pending.push(event("a", 3)));
        assert_eq!((pending.bytes, pending.unsealed, pending.sealed.len()), (6, 2, 1));

        // One scope of a ends: its writes still wait for the other.
        pending.end("a", Vec::new(), Some("1-0".into()));
        assert_eq!(keys(&pending.take()), [("b", 2)]);
        assert_eq!((pending.bytes, pending.unsealed), (4, 2));

        // A batch that did not reach Redis goes back in front of what came since.
        assert!(!pending.push(event("a", 4)));
        pending.end("a", Vec::new(), None);
        assert!(pending.open.is_empty());
        let batch = pending.take();
        assert_eq!(keys(&batch), [("a", 1), ("a", 3), ("a", 4)]);
        assert!(pending.push(event("a", 5)));
        pending.put_back(batch);
        assert_eq!(pending.bytes, 13);
        assert_eq!(keys(&pending.take()), [("a", 1), ("a", 3), ("a", 4), ("a", 5)]);
        assert_eq!(pending.bytes, 0);
    }

    #[test]
    fn a_job_s_writes_so_far_can_be_sealed_or_discarded_while_its_call_runs() {
        let mut pending = Pending::default();
        pending.open.entry("a".into()).or_default().calls += 1;
        pending.open.entry("b".into()).or_default().calls += 1;
        pending.push(event("a", 1));
        pending.push(event("b", 2));
        pending.seal("a"); // sent now, before a write that cannot wait
        pending.push(event("a", 3));
        assert_eq!(keys(&pending.take()), [("a", 1)]);
        pending.discard("b"); // b moved: what its call wrote is not sent
        assert_eq!((pending.bytes, pending.unsealed), (3, 1));
        pending.end("a", Vec::new(), None);
        pending.end("b", Vec::new(), None);
        assert_eq!(keys(&pending.take()), [("a", 3)]);
        assert_eq!((pending.bytes, pending.unsealed), (0, 0));
    }

    #[test]
    fn events_are_cut_into_entries_of_64_and_a_sixteenth_of_the_bound() {
        let state = Write { key: "s".into(), token: "1".into(), what: What::State(b"st".to_vec()) };
        let writes = [event("a", 1), state, event("bb", 0)];
        let Cut { entries: cut, counts } = super::cut(writes.iter(), 1 << 20);
        assert_eq!(cut, [b"1:a,1:x,2:bb,0:,".to_vec()]);
        assert_eq!(counts, [2]);

        // 64 to an entry, then a new one.
        let writes: Vec<_> = (0..130).map(|_| event("k", 1)).collect();
        let Cut { entries: cut, counts } = super::cut(writes.iter(), 1 << 20);
        assert_eq!(cut.iter().map(|e| e.len() / 8).collect::<Vec<_>>(), [64, 64, 2]);
        assert_eq!(counts, [64, 64, 2]);

        // A sixteenth of 1,600 bytes is 100: two events of 40 share an
        // entry, a third goes to the next; one larger event is alone.
        let writes = [event("k", 40), event("k", 40), event("k", 40), event("k", 200), event("k", 1)];
        let Cut { entries: cut, counts } = super::cut(writes.iter(), 1600);
        assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), [96, 48, 209, 8]);
        assert_eq!(counts, [2, 1, 1, 1]);
    }
}
