//! Tickers and schedules: each tick on exactly one node, ticks going on
//! when a holder dies, plans applied idempotently.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulse_pool::{JobProducer, Plan, ProducerError, Tick};
use pulse_testkit::unique;
use tokio::sync::mpsc;

use crate::{Call, Calls, PATIENCE, client, finish, node, options};

/// Receives the next tick of any of the holders, with the holder's index.
async fn next(ticks: &mut mpsc::UnboundedReceiver<(usize, Tick)>) -> (usize, Tick) {
    tokio::time::timeout(PATIENCE, ticks.recv()).await.expect("no tick within the patience").expect("ticks")
}

/// Each tick of the fired ones appears once, and every tick up to the
/// last was fired or counted as missed by the tick that followed it.
fn assert_each_tick_once(fired: &[(usize, Tick)]) {
    let mut seqs: Vec<u64> = fired.iter().map(|(_, tick)| tick.seq).collect();
    seqs.sort_unstable();
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "a tick fired twice: {fired:?}");
    let accounted: u64 = fired.iter().map(|(_, tick)| 1 + tick.missed).sum();
    let last = *seqs.last().unwrap();
    let first = seqs[0] - fired.iter().find(|(_, t)| t.seq == seqs[0]).unwrap().1.missed;
    assert_eq!(accounted, last - first + 1, "ticks neither fired nor missed: {fired:?}");
}

#[tokio::test]
async fn each_tick_fires_on_exactly_one_of_three_nodes_and_goes_on_when_one_dies() {
    let pool = unique("ticker");
    let interval = Duration::from_millis(200);
    let nodes = [
        pulse_pool::Node::client(&client(), &pool, options()).await.unwrap(),
        pulse_pool::Node::client(&client(), &pool, options()).await.unwrap(),
        pulse_pool::Node::client(&client(), &pool, options()).await.unwrap(),
    ];
    let (sender, mut ticks) = mpsc::unbounded_channel();
    let mut holders = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let mut ticker = node.ticker("every-200ms", interval).await.unwrap();
        let sender = sender.clone();
        holders.push(tokio::spawn(async move {
            while let Some(tick) = ticker.tick().await {
                let _ = sender.send((i, tick));
            }
        }));
    }
    let mut fired = Vec::new();
    while fired.len() < 20 {
        fired.push(next(&mut ticks).await);
    }
    assert_each_tick_once(&fired);
    let missed: u64 = fired.iter().map(|(_, t)| t.missed).sum();
    assert!(missed <= 2, "{missed} of 20 ticks missed: {fired:?}");
    let by_node: BTreeMap<usize, usize> = fired.iter().fold(BTreeMap::new(), |mut m, (i, _)| {
        *m.entry(*i).or_default() += 1;
        m
    });
    eprintln!("ticks per node: {by_node:?}, missed {missed}");

    // The node that fired the last tick dies: its ticker task ends without
    // any cleanup, as a killed process's would.
    let (dead, last) = *fired.last().unwrap();
    holders[dead].abort();
    let _ = (&mut holders[dead]).await;
    // A tick it may have taken just before dying is fine; what follows
    // must come from the others.
    while let Ok(extra) = ticks.try_recv() {
        fired.push(extra);
    }
    let killed_at = tokio::time::Instant::now();
    let mut after = Vec::new();
    while after.len() < 5 {
        let (i, tick) = next(&mut ticks).await;
        assert_ne!(i, dead, "the dead holder fired tick {}", tick.seq);
        if after.is_empty() {
            eprintln!(
                "first tick after the holder died: {:?} later (seq {} after {})",
                killed_at.elapsed(),
                tick.seq,
                last.seq
            );
        }
        after.push((i, tick));
    }
    fired.extend(after);
    assert_each_tick_once(&fired);

    // Stopping it on one node ends it on all.
    drop(holders);
    let ticker = nodes[0].ticker("every-200ms", interval).await.unwrap();
    let mut other = nodes[1].ticker("every-200ms", interval).await.unwrap();
    ticker.stop().await.unwrap();
    let end = tokio::time::timeout(PATIENCE, async { while other.tick().await.is_some() {} });
    end.await.expect("the other node's ticker did not end after a stop");
    for node in &nodes {
        node.close().await;
    }
    finish(&pool, &[]).await;
}

#[tokio::test]
async fn a_ticker_rejects_bad_names_and_intervals() {
    let pool = unique("ticker_input");
    let node = pulse_pool::Node::client(&client(), &pool, options()).await.unwrap();
    let error = node.ticker("no spaces", Duration::from_secs(1)).await.unwrap_err();
    assert!(error.to_string().contains("allowed are"), "{error}");
    let error = node.ticker("zero", Duration::ZERO).await.unwrap_err();
    assert!(error.to_string().contains("at least 1 ms"), "{error}");
    node.close().await;
    finish(&pool, &[]).await;
}

/// A producer whose plan a test changes.
#[derive(Clone, Default)]
struct Scripted {
    answer: Arc<Mutex<Option<Result<Plan, ProducerError>>>>,
    asked: Arc<Mutex<usize>>,
}

impl Scripted {
    fn set(&self, answer: Result<Plan, ProducerError>) {
        *self.answer.lock().unwrap() = Some(answer);
    }

    fn keep(&self, keys: &[&str]) {
        self.set(Ok(Plan {
            start: keys.iter().map(|k| ((*k).to_owned(), k.as_bytes().to_vec())).collect(),
            stop: Vec::new(),
            stop_all: true,
        }));
    }
}

impl JobProducer for Scripted {
    async fn plan(&self) -> Result<Plan, ProducerError> {
        *self.asked.lock().unwrap() += 1;
        self.answer.lock().unwrap().clone().unwrap_or(Err(ProducerError::Failed("no plan yet".into())))
    }
}

/// The keys of the running jobs.
async fn running(node: &pulse_pool::Node) -> BTreeSet<String> {
    node.jobs().await.unwrap().into_iter().map(|job| job.key).collect()
}

async fn wait_for_jobs(node: &pulse_pool::Node, keys: &[&str]) {
    let want: BTreeSet<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let have = running(node).await;
        if have == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "jobs {have:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_schedule_converges_the_pool_to_each_plan_without_duplicate_starts() {
    let pool = unique("schedule");
    let calls = Calls::default();
    let a = Arc::new(node(&pool, 2, &calls).await);
    let b = Arc::new(node(&pool, 1, &calls).await);
    let producer = Scripted::default();
    producer.keep(&["x", "y"]);
    // Both nodes run the schedule; each tick plans on one of them.
    let interval = Duration::from_millis(100);
    let mut on_a = a.schedule("keep", interval, producer.clone()).await.unwrap();
    let mut on_b = b.schedule("keep", interval, producer.clone()).await.unwrap();
    wait_for_jobs(&a, &["x", "y"]).await;

    producer.keep(&["y", "z"]);
    wait_for_jobs(&a, &["y", "z"]).await;
    // A job started by someone else is not the schedule's to stop.
    a.dispatch("mine", b"").await.unwrap();
    producer.keep(&["z"]);
    wait_for_jobs(&a, &["mine", "z"]).await;
    // A failing producer changes nothing; an explicit stop list stops
    // whatever it names.
    producer.set(Err(ProducerError::Failed("the list is unavailable".into())));
    let asked = *producer.asked.lock().unwrap();
    calls.wait_until("two more plans were asked for", |_| *producer.asked.lock().unwrap() >= asked + 2).await;
    assert_eq!(running(&a).await, ["mine", "z"].map(String::from).into());
    producer.set(Ok(Plan { start: Vec::new(), stop: vec!["mine".into()], stop_all: false }));
    wait_for_jobs(&a, &["z"]).await;

    // Every job started exactly once, however many ticks planned it.
    let starts = |key: &str| calls.of(key).iter().filter(|c| matches!(c, Call::Start { .. })).count();
    for key in ["x", "y", "z", "mine"] {
        assert_eq!(starts(key), 1, "starts of {key}: {:?}", calls.of(key));
    }
    assert!(*producer.asked.lock().unwrap() >= 6);

    // Finished ends the schedule on both nodes; its jobs keep running.
    producer.set(Err(ProducerError::Finished));
    tokio::time::timeout(PATIENCE, on_a.ended()).await.expect("the schedule did not end on a");
    tokio::time::timeout(PATIENCE, on_b.ended()).await.expect("the schedule did not end on b");
    assert_eq!(running(&a).await, ["z"].map(String::from).into());
    finish(&pool, &[&a, &b]).await;
}

#[tokio::test]
async fn a_ticker_waits_while_its_pool_is_gone_and_starts_over_once_it_is_back() {
    let pool = unique("ticker_loss");
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let epoch = format!("pulse:{{{pool}}}:epoch");
    let tickers = format!("pulse:{{{pool}}}:tickers");
    redis::cmd("SET").arg(&epoch).arg("before:4096").exec_async(&mut conn).await.unwrap();
    let node = pulse_pool::Node::client(&client(), &pool, options()).await.unwrap();
    let mut ticker = node.ticker("t", Duration::from_millis(50)).await.unwrap();
    assert!(within(&mut ticker).await.is_some());
    // Data loss (or a shutdown): the ticker and the epoch are gone. The
    // ticker fires nothing and does not recreate its entry...
    redis::cmd("DEL").arg(&tickers).arg(&epoch).exec_async(&mut conn).await.unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(300), ticker.tick()).await;
    assert!(quiet.is_err(), "a tick fired while the pool was gone: {quiet:?}");
    let exists: bool = redis::cmd("EXISTS").arg(&tickers).query_async(&mut conn).await.unwrap();
    assert!(!exists, "the entry was recreated while the pool was gone");
    // ...until the pool exists again: then it starts over.
    redis::cmd("SET").arg(&epoch).arg("after:4096").exec_async(&mut conn).await.unwrap();
    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        seqs.push(within(&mut ticker).await.expect("the ticker ended after data loss").seq);
    }
    assert!(seqs.contains(&1), "the ticker did not start over: {seqs:?}");
    // A stop from another holder ends it; holding it again creates it anew.
    node.ticker("t", Duration::from_millis(50)).await.unwrap().stop().await.unwrap();
    let mut ended = false;
    for _ in 0..3 {
        if within(&mut ticker).await.is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended, "the ticker went on after a stop");
    let mut again = node.ticker("t", Duration::from_millis(50)).await.unwrap();
    assert_eq!(within(&mut again).await.map(|tick| tick.seq), Some(1));
    again.stop().await.unwrap();
    node.close().await;
    finish(&pool, &[]).await;
}

#[tokio::test]
async fn closing_a_node_ends_its_tickers_and_schedules() {
    let pool = unique("ticker_close");
    let node = Arc::new(pulse_pool::Node::client(&client(), &pool, options()).await.unwrap());
    let mut ticker = node.ticker("t", Duration::from_millis(50)).await.unwrap();
    assert!(within(&mut ticker).await.is_some());
    let producer = Scripted::default();
    producer.keep(&[]);
    let mut schedule = node.schedule("s", Duration::from_millis(50), producer.clone()).await.unwrap();
    let asked = || *producer.asked.lock().unwrap();
    while asked() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.close().await;
    // At most the one tick fired into its channel before the close.
    let mut after = 0;
    while within(&mut ticker).await.is_some() {
        after += 1;
        assert!(after <= 1, "a ticker went on after its node closed");
    }
    tokio::time::timeout(PATIENCE, schedule.ended()).await.expect("a schedule went on after its node closed");
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    redis::cmd("DEL").arg(format!("pulse:{{{pool}}}:tickers")).exec_async(&mut conn).await.unwrap();
    finish(&pool, &[]).await;
}

/// The ticker's next tick, or `None` when it ended.
async fn within(ticker: &mut pulse_pool::Ticker) -> Option<Tick> {
    tokio::time::timeout(PATIENCE, ticker.tick()).await.expect("neither a tick nor the end")
}
