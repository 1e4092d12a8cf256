//! Workers joining and leaving while jobs run: jobs end up on the worker
//! their key routes to, in order, none lost.

use std::collections::HashMap;

use pulse_pool::hash::{VIRTUAL_SLOTS, slot_of};
use pulse_pool::{DispatchOutcome, EventOutcome, Node};
use pulse_testkit::unique;

use crate::{Call, Calls, Recording, finish, node};

/// Where each running job is, by the calls the handlers saw.
pub fn placement_of(calls: &[Call]) -> HashMap<String, String> {
    let mut running = HashMap::new();
    for call in calls.iter().cloned() {
        match call {
            Call::Start { worker, key, .. } => {
                running.insert(key, worker);
            }
            Call::Stop { key, worker } => {
                if running.get(&key) == Some(&worker) {
                    running.remove(&key);
                }
            }
            Call::Notify { .. } => {}
        }
    }
    running
}

/// The pool's slot table as Redis holds it: slot -> worker.
pub async fn slot_table(pool: &str) -> HashMap<u32, String> {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    pulse_testkit::slot_table(&mut conn, pool).await
}

/// Where each of `keys` routes by `table`: its slot's worker.
pub fn routes_by(
    table: &HashMap<u32, String>,
    keys: impl Iterator<Item = String>,
) -> HashMap<String, String> {
    keys.map(|key| {
        let worker = table[&slot_of(&key, VIRTUAL_SLOTS)].clone();
        (key, worker)
    })
    .collect()
}

/// Checks that every slot has a worker and every worker holding slots
/// holds floor(S/N) or ceil(S/N) of them; returns slots per worker.
pub fn assert_balanced(table: &HashMap<u32, String>, workers: usize) -> HashMap<String, u32> {
    assert_eq!(table.len(), VIRTUAL_SLOTS as usize, "every slot has a worker");
    let mut held: HashMap<String, u32> = HashMap::new();
    for worker in table.values() {
        *held.entry(worker.clone()).or_default() += 1;
    }
    assert_eq!(held.len(), workers, "{held:?}");
    let n = u32::try_from(workers).unwrap();
    let (low, high) = (VIRTUAL_SLOTS / n, VIRTUAL_SLOTS.div_ceil(n));
    assert!(held.values().all(|count| (low..=high).contains(count)), "{held:?} is not within {low}..={high}");
    held
}

/// Waits until every job runs, once, on the worker its key routes to.
async fn assert_placed(node: &Node, calls: &Calls, jobs: usize) {
    let table = slot_table(node.pool()).await;
    let placed = |calls: &[Call]| {
        let placement = placement_of(calls);
        placement.len() == jobs
            && placement.iter().all(|(key, worker)| *worker == table[&slot_of(key, VIRTUAL_SLOTS)])
    };
    calls.wait_until("every job sits on its slot's worker", placed).await;
    // Settled: every job is also running (not moving or queued) in Redis,
    // once the last starts are answered.
    for job in node.jobs().await.unwrap() {
        crate::wait_for_state(node, &job.key, pulse_pool::JobState::Running).await;
    }
}

#[tokio::test]
async fn a_leaving_worker_hands_its_jobs_to_the_others_with_their_events_in_order() {
    let pool = unique("leave");
    let calls = Calls::default();
    let node = node(&pool, 3, &calls).await;
    for i in 0..60 {
        assert_eq!(node.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let leaving = node.workers().await.unwrap().remove(0).id;
    // Notifications race the departure; each must arrive once, in order.
    let notifier = async {
        for round in 1..=5 {
            for i in 0..60 {
                let outcome = node.notify(&format!("job-{i}"), format!("{round}").as_bytes()).await.unwrap();
                assert!(matches!(outcome, EventOutcome::Done | EventOutcome::Held), "{outcome:?}");
            }
        }
    };
    let (_, removed) = tokio::join!(notifier, node.remove_worker(&leaving));
    removed.unwrap();
    calls
        .wait_until("every notification arrived", |c| {
            c.iter().filter(|c| matches!(c, Call::Notify { .. })).count() == 300
        })
        .await;
    for i in 0..60 {
        let key = format!("job-{i}");
        let rounds: Vec<Vec<u8>> = calls
            .of(&key)
            .into_iter()
            .filter_map(|c| if let Call::Notify { payload, .. } = c { Some(payload) } else { None })
            .collect();
        let expected: Vec<Vec<u8>> = (1..=5).map(|r| format!("{r}").into_bytes()).collect();
        assert_eq!(rounds, expected, "{key}");
    }
    // The leaving worker's jobs were stopped there and started again
    // elsewhere, marked requeued.
    let moved: Vec<String> = calls
        .all()
        .into_iter()
        .filter_map(|c| {
            if let Call::Stop { worker, key } = c { (worker == leaving).then_some(key) } else { None }
        })
        .collect();
    assert!(!moved.is_empty(), "the leaving worker held jobs");
    for key in &moved {
        let restarted = calls
            .of(key)
            .into_iter()
            .any(|c| matches!(c, Call::Start { worker, requeued: true, .. } if worker != leaving));
        assert!(restarted, "{key} was started again elsewhere");
    }
    assert_placed(&node, &calls, 60).await;
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn jobs_are_placed_by_their_key_when_workers_join_while_dispatches_are_in_flight() {
    let pool = unique("join_in_flight");
    let calls = Calls::default();
    let first = node(&pool, 2, &calls).await;
    let second = Node::join(&crate::client(), &pool, crate::options()).await.unwrap();
    let dispatches = async {
        for i in 0..300 {
            let outcome = first.dispatch(&format!("job-{i}"), b"").await.unwrap();
            assert_eq!(outcome, DispatchOutcome::Started);
        }
    };
    let joins = async {
        for _ in 0..2 {
            second.add_worker(Recording::new(&calls)).await.unwrap();
        }
    };
    tokio::join!(dispatches, joins);
    assert_eq!(first.workers().await.unwrap().len(), 4);
    // Once the pool settles, every job sits where its key routes, even the
    // ones started with an older table, and none runs twice.
    assert_placed(&first, &calls, 300).await;
    finish(&pool, &[&first, &second]).await;
}

#[tokio::test]
async fn every_node_lists_every_worker_of_the_pool() {
    let pool = unique("listing");
    let calls = Calls::default();
    let a = node(&pool, 2, &calls).await;
    let b = node(&pool, 1, &calls).await;
    let mut listed: Vec<String> = Vec::new();
    // B's worker joined last; A's replica shows it once it has applied it.
    let deadline = tokio::time::Instant::now() + crate::PATIENCE;
    while a.workers().await.unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "node A never saw B's worker");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for worker in a.workers().await.unwrap() {
        listed.push(format!("{}@{}", worker.id, if worker.node == a.id() { "a" } else { "b" }));
    }
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(listed.iter().filter(|w| w.ends_with("@a")).count(), 2);
    let nodes = a.nodes();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    // Node ids are ULIDs: unique across hosts whatever their pids.
    for node in [&a, &b] {
        assert!(ulid::Ulid::from_string(node.id()).is_ok(), "{} is not a ULID", node.id());
    }
    assert_ne!(a.id(), b.id());
    assert_eq!(nodes.iter().find(|n| n.id == a.id()).unwrap().workers.len(), 2);
    assert_eq!(nodes.iter().find(|n| n.id == b.id()).unwrap().workers.len(), 1);
    finish(&pool, &[&a, &b]).await;
}

#[tokio::test]
async fn closing_a_node_hands_its_jobs_to_the_other_node() {
    let pool = unique("node_close");
    let calls = Calls::default();
    let first = node(&pool, 1, &calls).await;
    let second = node(&pool, 1, &calls).await;
    for i in 0..40 {
        assert_eq!(first.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let first_worker = first.workers().await.unwrap().into_iter().find(|w| w.node == first.id()).unwrap().id;
    first.close().await;
    assert_placed(&second, &calls, 40).await;
    assert!(placement_of(&calls.all()).values().all(|w| *w != first_worker));
    finish(&pool, &[&second]).await;
}

/// Checks that no key ever ran on two workers at once: per key, a start
/// follows only the stop of the run before.
pub fn assert_no_overlap(calls: &[Call]) {
    let mut running: HashMap<&str, &str> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        match call {
            Call::Start { worker, key, .. } => {
                if let Some(other) = running.insert(key, worker) {
                    panic!("call {i}: {key} started on {worker} while it ran on {other}");
                }
            }
            Call::Stop { worker, key } => {
                assert_eq!(running.remove(key.as_str()), Some(worker.as_str()), "call {i}: {call:?}");
            }
            Call::Notify { worker, key, .. } => {
                assert_eq!(running.get(key.as_str()), Some(&worker.as_str()), "call {i}: {call:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_moves_a_fifth_to_the_new_worker_and_a_leave_moves_exactly_the_leavers_jobs() {
    const JOBS: usize = 1_000;
    let pool = unique("rebalance");
    let calls = Calls::default();
    let node = std::sync::Arc::new(node(&pool, 4, &calls).await);
    for i in 0..JOBS {
        assert_eq!(node.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    assert_placed(&node, &calls, JOBS).await;
    // Notifications to 100 keys race both membership changes.
    let notifier = tokio::spawn({
        let node = node.clone();
        async move {
            for round in 1..=6 {
                for i in 0..100 {
                    let outcome =
                        node.notify(&format!("job-{i}"), round.to_string().as_bytes()).await.unwrap();
                    assert!(matches!(outcome, EventOutcome::Done | EventOutcome::Held), "{outcome:?}");
                }
            }
        }
    });

    assert_balanced(&slot_table(&pool).await, 4);
    for step in ["join", "leave"] {
        let before = placement_of(&calls.all());
        let (new, workers) = if step == "join" {
            (Some(node.add_worker(Recording::new(&calls)).await.unwrap()), 5)
        } else {
            // The first worker: Go Pulse would move almost every job.
            node.remove_worker("w1").await.unwrap();
            (None, 4)
        };
        let table = slot_table(&pool).await;
        let held = assert_balanced(&table, workers);
        let routed = routes_by(&table, before.keys().cloned());
        assert_placed(&node, &calls, JOBS).await;
        let after = placement_of(&calls.all());
        let moved: Vec<&String> = before.keys().filter(|key| before[*key] != after[*key]).collect();
        let owner_changed: Vec<&String> = before.keys().filter(|key| before[*key] != routed[*key]).collect();
        assert_eq!(moved, owner_changed, "{step}: the jobs that moved are those whose slot changed owner");
        assert!(moved.iter().all(|key| routed[*key] == after[*key]), "{step}");
        if let Some(new) = &new {
            // Every job that moved went to the new worker: none moved
            // between two workers that stay.
            assert!(moved.iter().all(|key| after[*key] == *new), "join: a job moved between old workers");
            assert_eq!(held[new], VIRTUAL_SLOTS / 5, "the new worker holds a fifth of the slots");
        } else {
            let leavers: Vec<&String> = before.keys().filter(|key| before[*key] == "w1").collect();
            assert_eq!(moved, leavers, "leave: exactly the leaver's jobs moved");
        }
        let ratio = moved.len() as f64 / JOBS as f64;
        eprintln!("{step}: {} of {JOBS} jobs moved ({ratio:.3}; expected about 0.2)", moved.len());
        assert!((ratio - 0.2).abs() < 0.1, "{step}: moved {ratio:.3}, expected about 0.2");
    }
    notifier.await.unwrap();

    let all = calls.all();
    assert_no_overlap(&all);
    for i in 0..100 {
        let key = format!("job-{i}");
        let notes: Vec<(u64, Vec<u8>)> = all
            .iter()
            .filter_map(|call| match call {
                Call::Notify { key: k, payload, seq, .. } if *k == key => Some((*seq, payload.clone())),
                _ => None,
            })
            .collect();
        let payloads: Vec<String> =
            notes.iter().map(|(_, p)| String::from_utf8(p.clone()).unwrap()).collect();
        assert_eq!(payloads, ["1", "2", "3", "4", "5", "6"], "{key}: every notification, once, in order");
        let seqs: Vec<u64> = notes.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "{key}: sequence numbers without a gap");
    }
    finish(&pool, &[&node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_shutdown_stops_every_job_everywhere_and_leaves_nothing() {
    let pool = unique("shutdown");
    let calls = Calls::default();
    let options =
        pulse_pool::NodeOptions { lease_ttl: std::time::Duration::from_secs(2), ..crate::options() };
    let join = |calls: &Calls| {
        let options = options.clone();
        let recording = Recording::new(calls);
        let pool = pool.clone();
        async move {
            let node = Node::join(&crate::client(), &pool, options).await.unwrap();
            node.add_worker(recording.clone()).await.unwrap();
            node.add_worker(recording).await.unwrap();
            node
        }
    };
    let first = join(&calls).await;
    let second = join(&calls).await;
    // A node that dies without leaving: the shutdown goes on without it
    // once its workers are evicted.
    let dead = join(&calls).await;
    for i in 0..100 {
        assert_eq!(first.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let on_dead: usize =
        first.workers().await.unwrap().iter().filter(|w| w.node == dead.id()).map(|w| w.jobs as usize).sum();
    drop(dead);

    let client = Node::client(&crate::client(), &pool, crate::options()).await.unwrap();
    let shutdown = tokio::spawn(async move {
        let jobs = client.shutdown(crate::PATIENCE).await.unwrap();
        client.close().await;
        jobs
    });
    // While it runs, no node may join.
    let refused = loop {
        match Node::join(&crate::client(), &pool, crate::options()).await {
            Err(error) => break error,
            Ok(node) => node.close().await,
        }
    };
    assert!(matches!(refused, pulse_pool::Error::ShuttingDown(_)), "{refused}");
    assert_eq!(shutdown.await.unwrap(), 100);

    // Every job that ran on a live node was stopped by its handler.
    let stopped: std::collections::HashSet<String> = calls
        .all()
        .into_iter()
        .filter_map(|c| match c {
            Call::Stop { key, .. } => Some(key),
            _ => None,
        })
        .collect();
    assert_eq!(stopped.len(), 100 - on_dead, "jobs stopped by their handlers");
    assert!(first.workers().await.unwrap().is_empty());
    first.close().await;
    second.close().await;
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    pulse_testkit::assert_no_keys(&mut conn, &pool).await;
}

#[tokio::test]
async fn a_pool_of_one_slot_per_worker_is_refused_with_what_to_do() {
    let pool = unique("old_table");
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let epoch = format!("pulse:{{{pool}}}:epoch");
    // The epoch an earlier version writes: no slot count.
    redis::cmd("SET").arg(&epoch).arg("3f2a9c0d11e4b7a2").exec_async(&mut conn).await.unwrap();
    for client_only in [false, true] {
        let joined = if client_only {
            Node::client(&crate::client(), &pool, crate::options()).await
        } else {
            Node::join(&crate::client(), &pool, crate::options()).await
        };
        let Err(error) = joined else { panic!("a node joined a pool it routes differently") };
        assert!(matches!(error, pulse_pool::Error::IncompatiblePool { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("earlier version") && message.contains("pulse-host shutdown"), "{message}");
    }
    redis::cmd("DEL").arg(&epoch).exec_async(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_status_tells_its_history_its_dispatch_then_each_change_of_hands() {
    const JOBS: usize = 20;
    let pool = unique("history");
    let calls = Calls::default();
    let node = node(&pool, 2, &calls).await;
    for i in 0..JOBS {
        assert_eq!(node.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    assert_placed(&node, &calls, JOBS).await;
    let before = placement_of(&calls.all());
    node.remove_worker("w1").await.unwrap();
    assert_placed(&node, &calls, JOBS).await;
    let mut moved = 0;
    for i in 0..JOBS {
        let key = format!("job-{i}");
        let job = node.status(&key).await.unwrap().unwrap();
        let history: Vec<(&str, Option<&str>)> =
            job.history.iter().map(|e| (e.event.as_str(), e.worker.as_deref())).collect();
        if before[&key] == "w1" {
            moved += 1;
            assert_eq!(
                history,
                [("dispatched", None), ("returned", Some("w1")), ("started", Some("w2"))],
                "{key} moved"
            );
        } else {
            assert_eq!(history, [("dispatched", None)], "{key} stayed");
        }
        assert_eq!(job.history[0].at_ms, job.created_at_ms);
        assert!(job.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "{key}: oldest first");
    }
    assert!(moved > 0 && moved < JOBS, "both workers had jobs");
    let listed = node.jobs().await.unwrap();
    assert!(listed.iter().all(|job| job.history.is_empty()), "a listing reads no history");
    finish(&pool, &[&node]).await;
}
