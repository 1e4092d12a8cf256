//! Stop and notify: typed outcomes, order, sequence numbers, duplicates.

use pulse_pool::{DispatchOutcome, EventOutcome};
use pulse_testkit::unique;

use crate::{Call, Calls, emitted_by, finish, node};

#[tokio::test]
async fn notifications_arrive_in_order_with_gapless_sequence_numbers() {
    let pool = unique("notify_order");
    let calls = Calls::default();
    let node = node(&pool, 3, &calls).await;
    node.dispatch("n", b"").await.unwrap();
    for i in 1..=50 {
        assert_eq!(node.notify("n", format!("{i}").as_bytes()).await.unwrap(), EventOutcome::Done);
    }
    let seen: Vec<(Vec<u8>, u64)> = calls
        .of("n")
        .into_iter()
        .filter_map(|c| if let Call::Notify { payload, seq, .. } = c { Some((payload, seq)) } else { None })
        .collect();
    let expected: Vec<(Vec<u8>, u64)> = (1..=50).map(|i| (format!("{i}").into_bytes(), i)).collect();
    assert_eq!(seen, expected);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn stop_calls_the_handler_and_removes_the_job() {
    let pool = unique("stop");
    let calls = Calls::default();
    let node = node(&pool, 2, &calls).await;
    node.dispatch("s", b"").await.unwrap();
    assert_eq!(node.stop("s").await.unwrap(), EventOutcome::Done);
    assert!(matches!(calls.of("s").last(), Some(Call::Stop { .. })));
    assert_eq!(node.status("s").await.unwrap(), None);
    assert_eq!(node.stop("s").await.unwrap(), EventOutcome::NoSuchJob);
    assert_eq!(node.notify("s", b"x").await.unwrap(), EventOutcome::NoSuchJob);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn handler_errors_come_back_typed() {
    let pool = unique("notify_errors");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    node.dispatch("e", b"").await.unwrap();
    assert_eq!(
        node.notify("e", b"oops").await.unwrap(),
        EventOutcome::HandlerError("retryable: notification not handled".into())
    );
    assert_eq!(
        node.notify("e", b"fine").await.unwrap(),
        EventOutcome::Done,
        "a non-fatal error leaves the job running"
    );
    assert_eq!(
        node.notify("e", b"fatal").await.unwrap(),
        EventOutcome::JobFailed("notification failed on purpose".into())
    );
    assert_eq!(
        node.notify("e", b"x").await.unwrap(),
        EventOutcome::JobFailed("notification failed on purpose".into())
    );
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn events_for_a_waiting_job_are_held_and_delivered_in_order_after_its_start() {
    let pool = unique("held");
    let calls = Calls::default();
    let client = pulse_pool::Node::client(&crate::client(), &pool, crate::options()).await.unwrap();
    assert_eq!(client.dispatch("h", b"").await.unwrap(), DispatchOutcome::Queued);
    for i in 1..=3 {
        assert_eq!(client.notify("h", format!("{i}").as_bytes()).await.unwrap(), EventOutcome::Held);
    }
    // A stop of a job still waiting, with nothing held, removes it at once.
    assert_eq!(client.dispatch("gone", b"").await.unwrap(), DispatchOutcome::Queued);
    assert_eq!(client.stop("gone").await.unwrap(), EventOutcome::Done);
    assert_eq!(client.status("gone").await.unwrap(), None);
    // With a notification held before it, the stop waits behind it.
    assert_eq!(client.dispatch("later", b"").await.unwrap(), DispatchOutcome::Queued);
    assert_eq!(client.notify("later", b"last words").await.unwrap(), EventOutcome::Held);
    assert_eq!(client.stop("later").await.unwrap(), EventOutcome::Held);
    let full = node(&pool, 1, &calls).await;
    calls.wait_until("the held events arrive", |c| c.len() == 7).await;
    let later: Vec<&str> = calls
        .of("later")
        .iter()
        .map(|c| match c {
            Call::Start { .. } => "start",
            Call::Notify { .. } => "notify",
            Call::Stop { .. } => "stop",
        })
        .collect();
    assert_eq!(later, ["start", "notify", "stop"]);
    let order: Vec<String> = calls
        .of("h")
        .into_iter()
        .map(|c| match c {
            Call::Start { .. } => "start".to_owned(),
            Call::Notify { payload, seq, .. } => format!("{}@{seq}", String::from_utf8_lossy(&payload)),
            Call::Stop { .. } => "stop".to_owned(),
        })
        .collect();
    assert_eq!(order, ["start", "1@1", "2@2", "3@3"]);
    finish(&pool, &[&full, &client]).await;
}

#[tokio::test]
async fn a_start_delivered_twice_under_the_same_token_starts_the_job_once() {
    let pool = unique("duplicate_start");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    node.dispatch("d", b"payload").await.unwrap();
    let worker = node.workers().await.unwrap().remove(0).id;
    // Deliver the same start again (the worker trimmed the first one from
    // its inbox once processed): key, token, seq, reply, request, attempt,
    // requeued, created, payload, has state, state.
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let inbox = format!("pulse:{{{pool}}}:stream:inbox.{worker}");
    let ownership: String = redis::cmd("HGET")
        .arg(format!("pulse:{{{pool}}}:jobs"))
        .arg("d")
        .query_async(&mut conn)
        .await
        .unwrap();
    let token = ownership.split('|').nth(2).unwrap().to_owned();
    let p: String = ["d", token.as_str(), "0", "", "", "1", "0", "", "payload", "0", ""]
        .iter()
        .map(|field| format!("{}:{field},", field.len()))
        .collect();
    redis::cmd("XADD")
        .arg(&inbox)
        .arg("*")
        .arg("n")
        .arg("start")
        .arg("p")
        .arg(p)
        .exec_async(&mut conn)
        .await
        .unwrap();
    // A notification behind it proves the duplicate was processed.
    assert_eq!(node.notify("d", b"after").await.unwrap(), EventOutcome::Done);
    assert_eq!(calls.of("d").iter().filter(|c| matches!(c, Call::Start { .. })).count(), 1);
    finish(&pool, &[&node]).await;
}

/// Emits on `notify`: the payload says how many events of how many bytes
/// (`count x size`).
#[derive(Clone, Default)]
struct Emitter {
    contexts: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, pulse_pool::JobContext>>>,
    /// A context of an earlier run of a job: with a notification
    /// `<count>x<size>`, each tenth event is emitted through it too.
    stale: std::sync::Arc<std::sync::Mutex<Option<pulse_pool::JobContext>>>,
}

impl pulse_pool::JobHandler for Emitter {
    async fn start(
        &self,
        job: pulse_pool::Job,
        ctx: pulse_pool::JobContext,
    ) -> Result<(), pulse_pool::HandlerError> {
        self.contexts.lock().unwrap().insert(job.key, ctx);
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), pulse_pool::HandlerError> {
        self.contexts.lock().unwrap().remove(key);
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Vec<u8>, _seq: u64) -> Result<(), pulse_pool::HandlerError> {
        let ctx = self.contexts.lock().unwrap().get(key).cloned().unwrap();
        let text = String::from_utf8(payload).unwrap();
        let (count, size) = text.split_once('x').unwrap();
        let event = vec![b'e'; size.parse().unwrap()];
        let stale = self.stale.lock().unwrap().clone();
        for i in 0..count.parse::<usize>().unwrap() {
            if let Some(stale) = stale.as_ref().filter(|_| i % 10 == 0) {
                stale.emit(b"stale").await.unwrap();
            }
            ctx.emit(&event).await.unwrap();
        }
        Ok(())
    }
}

/// A stream entry as XRANGE answers it: id, then field and value pairs.
type Entry = (String, Vec<(String, Vec<u8>)>);

/// The entries of the pool's events stream, oldest first.
async fn entries(pool: &str) -> Vec<Entry> {
    entries_on(pulse_testkit::shared_redis_url(), pool).await
}

/// [`entries`], of a pool on the server at `url`.
async fn entries_on(url: &str, pool: &str) -> Vec<Entry> {
    let mut conn = pulse_testkit::connect(url).await;
    redis::cmd("XRANGE")
        .arg(format!("pulse:{{{pool}}}:stream:events"))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// What the pool's events stream holds, and what its accounting says it
/// holds: the newest entry's counters (`c` bytes and `e` events written)
/// less the oldest entry's, less what the oldest holds. Also checks each
/// entry's counters against what it holds.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    events: usize,
    bytes: usize,
    counted_events: usize,
    counted_bytes: usize,
}

/// The field `name` of an entry, as a number.
fn number(fields: &[(String, Vec<u8>)], name: &str) -> usize {
    let value = fields.iter().find(|(f, _)| f == name).map(|(_, v)| v.clone()).unwrap();
    String::from_utf8(value).unwrap().parse().unwrap()
}

/// The events an entry holds (one without `k`, an earlier version's).
fn events_of(fields: &[(String, Vec<u8>)]) -> usize {
    if fields.iter().any(|(f, _)| f == "k") { number(fields, "k") } else { 1 }
}

async fn events_held(pool: &str) -> Held {
    events_held_on(pulse_testkit::shared_redis_url(), pool).await
}

/// [`events_held`], of a pool on the server at `url`.
async fn events_held_on(url: &str, pool: &str) -> Held {
    let entries = entries_on(url, pool).await;
    for pair in entries.windows(2) {
        let (before, after) = (&pair[0].1, &pair[1].1);
        assert_eq!(number(after, "c"), number(before, "c") + payload_bytes(&pair[1..]), "c counts the bytes");
        assert_eq!(number(after, "e"), number(before, "e") + events_of(after), "e counts the events");
    }
    let (counted_events, counted_bytes) = match (entries.first(), entries.last()) {
        (Some((_, oldest)), Some((_, newest))) => (
            number(newest, "e") - (number(oldest, "e") - events_of(oldest)),
            number(newest, "c") - (number(oldest, "c") - payload_bytes(&entries[..1])),
        ),
        _ => (0, 0),
    };
    let events = entries.iter().map(|(_, fields)| events_of(fields)).sum();
    Held { events, bytes: payload_bytes(&entries), counted_events, counted_bytes }
}

/// The bytes an event of job `key` with a payload of `size` bytes takes
/// in its entry: the netstrings of both.
fn event_bytes(key: &str, size: usize) -> usize {
    pulse_rmap::netstring_len(key.len()) + pulse_rmap::netstring_len(size)
}

/// A node of pool `pool` whose events stream keeps 100 events and 64 KiB,
/// running job `e` on an [`Emitter`].
async fn bounded_emitter(pool: &str) -> pulse_pool::Node {
    let options =
        pulse_pool::NodeOptions { events_retention: 100, events_max_bytes: 64 << 10, ..crate::options() };
    let node = pulse_pool::Node::join(&crate::client(), pool, options).await.unwrap();
    node.add_worker(Emitter::default()).await.unwrap();
    node.dispatch("e", b"").await.unwrap();
    node
}

/// The bytes of the events of `entries`: their batches (`b`), or the
/// payloads of entries of one event an earlier version wrote (`p`).
fn payload_bytes(entries: &[Entry]) -> usize {
    entries
        .iter()
        .flat_map(|(_, fields)| fields.iter().filter(|(f, _)| f == "p" || f == "b"))
        .map(|(_, p)| p.len())
        .sum()
}

#[tokio::test]
async fn the_events_stream_keeps_its_retention_in_events_and_in_bytes() {
    let pool = unique("events_bounds");
    let node = bounded_emitter(&pool).await;

    // Many small events: about the retention in events. Entries are
    // trimmed whole, and hold at most 64 events.
    assert_eq!(node.notify("e", b"500x100").await.unwrap(), EventOutcome::Done);
    let held = events_held(&pool).await;
    assert!((100..=227).contains(&held.events), "{held:?} for a retention of 100");
    assert_eq!(held.bytes, held.events * event_bytes("e", 100), "{held:?}");
    assert_eq!((held.counted_events, held.counted_bytes), (held.events, held.bytes), "{held:?}");
    let entries = entries(&pool).await;
    assert!(
        entries.len() < held.events,
        "{} entries for {} events: they share entries",
        entries.len(),
        held.events
    );
    // Large events: never more than events_max_bytes of them.
    assert_eq!(node.notify("e", b"40x16000").await.unwrap(), EventOutcome::Done);
    let held = events_held(&pool).await;
    assert!(held.bytes <= 64 << 10 && held.events >= 3, "{held:?} for a limit of 64 KiB");
    assert_eq!((held.counted_events, held.counted_bytes), (held.events, held.bytes), "{held:?}");
    // One event larger than what is left: the stream holds it alone.
    assert_eq!(node.notify("e", b"1x65536").await.unwrap(), EventOutcome::Done);
    let bytes = event_bytes("e", 65536);
    assert_eq!(events_held(&pool).await, Held { events: 1, bytes, counted_events: 1, counted_bytes: bytes });
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn the_events_stream_keeps_its_retention_when_its_oldest_entries_hold_more_events_than_the_rest() {
    let pool = unique("events_uneven");
    let node = bounded_emitter(&pool).await;
    // Entries of 64 events first, then entries of one event each: the
    // oldest entries hold far more than the average, so dropping as many
    // entries as the average says would drop too many events.
    assert_eq!(node.notify("e", b"200x100").await.unwrap(), EventOutcome::Done);
    for written in 1..=300 {
        assert_eq!(node.notify("e", b"1x100").await.unwrap(), EventOutcome::Done);
        let held = events_held(&pool).await;
        assert!(
            (100..=227).contains(&held.events),
            "{held:?} after {written} single events, for a retention of 100"
        );
        assert_eq!((held.counted_events, held.counted_bytes), (held.events, held.bytes), "{held:?}");
    }
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn the_events_stream_finds_where_to_trim_among_entries_of_one_millisecond_without_walking_them() {
    // A private server: its command counts are this test's alone.
    let server = pulse_testkit::RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    // Far from the byte bound: only the count trims.
    let options =
        pulse_pool::NodeOptions { events_retention: 100, events_max_bytes: 1 << 20, ..crate::options() };
    let node = pulse_pool::Node::join(&client, "dense", options).await.unwrap();
    node.add_worker(Emitter::default()).await.unwrap();
    node.dispatch("e", b"").await.unwrap();
    // 1,000 entries of one event each in one millisecond, as a busy pool
    // adds them, with their counters; a second ahead of the clock, so the
    // entries the job adds next share that millisecond too.
    let mut conn = server.connect().await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let ms = now.0 * 1000 + 1000;
    let mut batch = Vec::new();
    pulse_rmap::push_netstring(&mut batch, b"e");
    pulse_rmap::push_netstring(&mut batch, &[b'e'; 100]);
    let mut pipe = redis::pipe();
    for seq in 0..1000 {
        pipe.cmd("XADD")
            .arg("pulse:{dense}:stream:events")
            .arg(format!("{ms}-{seq}"))
            .arg(&["n", "emit", "b"])
            .arg(&batch)
            .arg(&["k", "1", "c"])
            .arg((seq + 1) * batch.len())
            .arg("e")
            .arg(seq + 1)
            .ignore();
    }
    pipe.cmd("SET").arg("pulse:{dense}:events-written").arg(1000 * batch.len()).ignore();
    pipe.cmd("SET").arg("pulse:{dense}:events-count").arg(1000).ignore();
    pipe.cmd("CONFIG").arg("RESETSTAT").ignore();
    pipe.exec_async(&mut conn).await.unwrap();

    // 64 single events: the event counter passes a multiple of 64, and
    // the stream is trimmed to its retention.
    for _ in 0..64 {
        assert_eq!(node.notify("e", b"1x100").await.unwrap(), EventOutcome::Done);
    }
    let stats = crate::command_calls(&mut conn).await;
    let calls = |command: &str| stats.get(command).copied().unwrap_or(0);
    // The entry to keep is found by its sequence number, in a few reads:
    // the walk through the oldest entries (which begins with XLEN) never
    // runs.
    assert_eq!(calls("xlen"), 0, "the trim walked the stream: {stats:?}");
    assert!(calls("xtrim") >= 1, "never trimmed: {stats:?}");
    let held = events_held_on(server.url(), "dense").await;
    assert!((100..=227).contains(&held.events), "{held:?} for a retention of 100");
    assert_eq!((held.counted_events, held.counted_bytes), (held.events, held.bytes), "{held:?}");
    node.close().await;
}

#[tokio::test]
async fn events_an_earlier_version_wrote_count_toward_the_byte_bound() {
    let pool = unique("events_earlier");
    let node = bounded_emitter(&pool).await;
    // What a version whose entries carry no byte counter leaves: 15
    // entries of 4,000 bytes, and the bytes it counted as held.
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    for _ in 0..15 {
        redis::cmd("XADD")
            .arg(format!("pulse:{{{pool}}}:stream:events"))
            .arg("*")
            .arg(&["n", "emit", "t", "earlier", "p"])
            .arg(vec![b'o'; 4000])
            .exec_async(&mut conn)
            .await
            .unwrap();
    }
    redis::cmd("SET")
        .arg(format!("pulse:{{{pool}}}:events-bytes"))
        .arg(60_000)
        .exec_async(&mut conn)
        .await
        .unwrap();
    let earlier =
        |entries: &[Entry]| entries.iter().filter(|(_, fields)| fields.iter().all(|(f, _)| f != "c")).count();

    // 8,000 bytes more make 68,000, past 64 KiB: the oldest entries go,
    // only as many as it takes.
    assert_eq!(node.notify("e", b"2x4000").await.unwrap(), EventOutcome::Done);
    let held = entries(&pool).await;
    let bytes = payload_bytes(&held);
    assert!(bytes <= 64 << 10, "{bytes} bytes held for a limit of 64 KiB");
    assert!((10..15).contains(&earlier(&held)), "{} of 15 earlier entries left", earlier(&held));
    assert_eq!(emitted_by(&pool, "e").await.len(), 2);
    // Large events: the earlier entries are all trimmed, and what is left
    // is counted exactly.
    assert_eq!(node.notify("e", b"40x16000").await.unwrap(), EventOutcome::Done);
    assert_eq!(earlier(&entries(&pool).await), 0);
    let held = events_held(&pool).await;
    assert!(held.bytes <= 64 << 10 && held.events >= 3, "{held:?} for a limit of 64 KiB");
    assert_eq!((held.counted_events, held.counted_bytes), (held.events, held.bytes), "{held:?}");
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn events_are_written_in_order_before_the_answer_and_without_a_call_and_never_for_a_job_gone() {
    let pool = unique("events_order");
    let node = pulse_pool::Node::join(&crate::client(), &pool, crate::options()).await.unwrap();
    let emitter = Emitter::default();
    node.add_worker(emitter.clone()).await.unwrap();
    node.dispatch("gone", b"").await.unwrap();
    node.dispatch("e", b"").await.unwrap();
    let ctx = |key: &str| emitter.contexts.lock().unwrap().get(key).cloned().unwrap();
    let gone = ctx("gone");
    let live = ctx("e");

    // Emitted in a call: written before the call's answer comes back.
    assert_eq!(node.notify("e", b"3x1").await.unwrap(), EventOutcome::Done);
    assert_eq!(emitted_by(&pool, "e").await, vec![b"e".to_vec(); 3]);

    // Emitted outside any call (as a timer does): written with no other
    // traffic, in the order emitted.
    for i in 0..20 {
        live.emit(format!("t{i}").as_bytes()).await.unwrap();
    }
    // A job that stopped: its event is accepted here but refused by its
    // token when written, so it never reaches the stream.
    assert_eq!(node.stop("gone").await.unwrap(), EventOutcome::Done);
    gone.emit(b"late").await.unwrap();
    live.emit(b"last").await.unwrap();
    let expected: Vec<Vec<u8>> = std::iter::repeat_n(b"e".to_vec(), 3)
        .chain((0..20).map(|i| format!("t{i}").into_bytes()))
        .chain([b"last".to_vec()])
        .collect();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let seen = emitted_by(&pool, "e").await;
        if seen == expected {
            break;
        }
        assert!(
            seen.len() < expected.len() && tokio::time::Instant::now() < deadline,
            "events of e: {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The queue is written in order: "late" came before "last".
    assert_eq!(emitted_by(&pool, "gone").await, Vec::<Vec<u8>>::new());
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn events_the_fence_refuses_leave_the_others_of_their_entries_in_order() {
    let pool = unique("events_refused");
    let node = pulse_pool::Node::join(&crate::client(), &pool, crate::options()).await.unwrap();
    let emitter = Emitter::default();
    node.add_worker(emitter.clone()).await.unwrap();
    node.dispatch("e", b"").await.unwrap();
    let earlier = emitter.contexts.lock().unwrap().get("e").cloned().unwrap();
    assert_eq!(node.stop("e").await.unwrap(), EventOutcome::Done);
    node.dispatch("e", b"").await.unwrap();
    *emitter.stale.lock().unwrap() = Some(earlier);

    // One call emits 150 events and, through the earlier run's context, 15
    // more under its old token: one write of three entries' worth, each
    // with events the fence refuses.
    assert_eq!(node.notify("e", b"150x3").await.unwrap(), EventOutcome::Done);
    assert_eq!(emitted_by(&pool, "e").await, vec![b"eee".to_vec(); 150]);
    let held = events_held(&pool).await;
    assert_eq!((held.events, held.counted_events, held.counted_bytes), (150, 150, held.bytes), "{held:?}");
    assert!(entries(&pool).await.iter().all(|(_, fields)| events_of(fields) <= 64));
    finish(&pool, &[&node]).await;
}

/// The names of the entries of reply stream `stream`, after `after`.
async fn reply_names(conn: &mut redis::aio::MultiplexedConnection, stream: &str, after: &str) -> Vec<String> {
    let reply: redis::streams::StreamRangeReply =
        redis::cmd("XRANGE").arg(stream).arg(format!("({after}")).arg("+").query_async(conn).await.unwrap();
    reply.ids.iter().map(|entry| entry.get::<String>("n").unwrap_or_default()).collect()
}

#[tokio::test]
async fn a_worker_answers_a_node_of_an_earlier_version_with_one_entry_per_answer() {
    let pool = unique("answer_formats");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    let worker = node.workers().await.unwrap().remove(0).id;
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;

    // This version's node reads the answers of a worker's flush in one
    // `answers` entry.
    let jobs: Vec<(String, Vec<u8>)> = (0..20).map(|i| (format!("new-{i}"), Vec::new())).collect();
    for outcome in node.dispatch_batch(&jobs).await {
        assert_eq!(outcome.unwrap(), DispatchOutcome::Started);
    }
    let ours = format!("pulse:{{{pool}}}:stream:replies.{}", node.id());
    let names = reply_names(&mut conn, &ours, "0-0").await;
    assert!(names.contains(&"answers".to_owned()), "{names:?}");
    assert!(!names.contains(&"started".to_owned()), "{names:?}");

    // A node of an earlier version makes bare request ids and reads one
    // answer per entry: its starts, written as its dispatch script writes
    // them (key, token, seq, reply, request, attempt, requeued, created,
    // payload, has state, state).
    let theirs = format!("pulse:{{{pool}}}:stream:replies.earlier-node");
    let hello: String = redis::cmd("XADD")
        .arg(&theirs)
        .arg("*")
        .arg("n")
        .arg("hello")
        .arg("p")
        .arg("")
        .query_async(&mut conn)
        .await
        .unwrap();
    for i in 0..2 {
        let key = format!("old-{i}");
        let token: u64 =
            redis::cmd("INCR").arg(format!("pulse:{{{pool}}}:tokens")).query_async(&mut conn).await.unwrap();
        let token = token.to_string();
        let request = format!("01EARLIER{i}");
        let p: String = [key.as_str(), &token, "0", &theirs, &request, "1", "0", "", "x", "0", ""]
            .iter()
            .map(|field| format!("{}:{field},", field.len()))
            .collect();
        redis::pipe()
            .hset(format!("pulse:{{{pool}}}:jobs"), &key, format!("running|{worker}|{token}|0"))
            .hset_multiple(
                format!("pulse:{{{pool}}}:job:{key}"),
                &[("payload", "x"), ("created", "1"), ("attempt", "1")],
            )
            .sadd(format!("pulse:{{{pool}}}:worker:{worker}:jobs"), &key)
            .xadd(
                format!("pulse:{{{pool}}}:stream:inbox.{worker}"),
                "*",
                &[("n", "start"), ("p", p.as_str())],
            )
            .exec_async(&mut conn)
            .await
            .unwrap();
    }
    let mut answers: Vec<(String, Vec<u8>)> = Vec::new();
    let mut cursor = hello;
    while answers.len() < 2 {
        let read: Option<redis::streams::StreamReadReply> = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(10_000)
            .arg("STREAMS")
            .arg(&theirs)
            .arg(&cursor)
            .query_async(&mut conn)
            .await
            .unwrap();
        let read = read.expect("the worker answers within 10 s");
        for entry in read.keys.into_iter().flat_map(|k| k.ids) {
            answers.push((entry.get("n").unwrap(), entry.get("p").unwrap()));
            cursor = entry.id;
        }
    }
    assert_eq!(
        answers,
        [
            ("started".to_owned(), b"10:01EARLIER0,0:,".to_vec()),
            ("started".to_owned(), b"10:01EARLIER1,0:,".to_vec())
        ]
    );
    redis::cmd("DEL").arg(&theirs).exec_async(&mut conn).await.unwrap();
    finish(&pool, &[&node]).await;
}

/// A pool of 4 slot groups keeps its events in a stream per group: they
/// are read page by page up to a bound, newest first and followed, across
/// the groups, each event once, each job's in the order emitted.
#[tokio::test]
async fn the_events_of_a_pool_of_slot_groups_are_read_and_followed_across_its_groups() {
    let pool = unique("events_groups");
    let options = pulse_pool::NodeOptions { slot_groups: 4, ..crate::options() };
    let node = pulse_pool::Node::join(&crate::client(), &pool, options).await.unwrap();
    node.add_worker(Emitter::default()).await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let groups: std::collections::BTreeSet<u32> =
        keys.iter().map(|key| pulse_pool::hash::group_of(key, pulse_pool::hash::VIRTUAL_SLOTS, 4)).collect();
    assert!(groups.len() > 1, "the keys fall in several groups: {groups:?}");
    for key in &keys {
        node.dispatch(key, b"").await.unwrap();
        assert_eq!(node.notify(key, b"2x3").await.unwrap(), EventOutcome::Done);
    }
    let emitted = node.emitted().await.unwrap();
    let bound = emitted.newest_id().await.unwrap().expect("events were emitted");
    let (mut after, mut all) = (None, Vec::new());
    loop {
        let (page, next) = emitted.page_until(after.as_deref(), &bound, 5).await.unwrap();
        assert!(page.len() <= 5);
        all.extend(page);
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let ids: std::collections::HashSet<&str> = all.iter().map(|event| event.id.as_str()).collect();
    assert_eq!((all.len(), ids.len()), (24, 24), "each event once: {all:?}");
    for key in &keys {
        assert_eq!(all.iter().filter(|event| &event.key == key).count(), 2, "{key}");
    }
    assert!(all.windows(2).all(|pair| pair[0].created_at_ms <= pair[1].created_at_ms), "oldest first");
    let newest = emitted.newest(5).await.unwrap();
    assert_eq!(newest.len(), 5);
    assert!(newest.windows(2).all(|pair| pair[0].created_at_ms >= pair[1].created_at_ms), "newest first");

    // Followed from the bound: only what comes after it, from every group.
    let mut following = emitted.follow(Some(bound)).await.unwrap();
    for key in &keys {
        assert_eq!(node.notify(key, b"1x1").await.unwrap(), EventOutcome::Done);
    }
    let mut followed = Vec::new();
    while followed.len() < keys.len() {
        let next = tokio::time::timeout(crate::PATIENCE, following.recv()).await.expect("an event in time");
        match next {
            Some(pulse_pool::Followed::Event(event)) => followed.push(event.key),
            other => panic!("{other:?}"),
        }
    }
    followed.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(followed, expected);
    following.close().await;

    let error = emitted.page(Some("1-0"), 5).await.unwrap_err();
    assert!(matches!(error, pulse_pool::Error::InvalidEventId { groups: 4, .. }), "{error}");
    node.shutdown(crate::PATIENCE).await.unwrap();
    node.close().await;
}
