//! Replacing workers one at a time, as a new release rolls through a pool:
//! each job moves once, to the worker that replaced its own, in order.

use std::collections::HashMap;

use pulse_pool::{DispatchOutcome, EventOutcome, Release, WorkerOptions};
use pulse_testkit::unique;

use crate::membership::{assert_no_overlap, placement_of, slot_table};
use crate::{Call, Recording, finish, node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_each_worker_in_turn_moves_each_job_once_to_its_heir() {
    const JOBS: usize = 400;
    let pool = unique("replace");
    let calls = crate::Calls::default();
    let first = std::sync::Arc::new(node(&pool, 2, &calls).await);
    let second = node(&pool, 2, &calls).await;
    for i in 0..JOBS {
        assert_eq!(first.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    calls.wait_until("every job started", |c| placement_of(c).len() == JOBS).await;
    // Notifications to 100 keys race the replacements.
    let notifier = tokio::spawn({
        let node = first.clone();
        async move {
            for round in 1..=8 {
                for i in 0..100 {
                    let outcome =
                        node.notify(&format!("job-{i}"), round.to_string().as_bytes()).await.unwrap();
                    assert!(matches!(outcome, EventOutcome::Done | EventOutcome::Held), "{outcome:?}");
                }
            }
        }
    });
    let v2 = Release { digest: "sha256:2222".into(), version: "2.0.0".into() };
    let old: Vec<_> = first.workers().await.unwrap();
    assert!(old.iter().all(|w| w.release == Release::default()), "{old:?}");
    for worker in &old {
        let before_table = slot_table(&pool).await;
        let before = placement_of(&calls.all());
        let node = if worker.node == first.id() { &*first } else { &second };
        let options = WorkerOptions { release: v2.clone(), ..WorkerOptions::default() };
        let heir = node.replace_worker(&worker.id, Recording::new(&calls), options).await.unwrap();
        // The heir holds exactly the old worker's slots; no other slot moved.
        let table = slot_table(&pool).await;
        for (slot, owner) in &before_table {
            let expected = if *owner == worker.id { &heir } else { owner };
            assert_eq!(&table[slot], expected, "slot {slot} after {} was replaced", worker.id);
        }
        let theirs: Vec<&String> = before.iter().filter(|(_, w)| **w == worker.id).map(|(k, _)| k).collect();
        calls
            .wait_until("the old worker's jobs run on its heir", |c| {
                let now = placement_of(c);
                now.len() == JOBS && theirs.iter().all(|key| now[*key] == heir)
            })
            .await;
        let after = placement_of(&calls.all());
        let moved: Vec<&String> = before.keys().filter(|key| before[*key] != after[*key]).collect();
        let mut expected = theirs.clone();
        let mut moved_sorted = moved.clone();
        expected.sort();
        moved_sorted.sort();
        assert_eq!(moved_sorted, expected, "replacing {}: exactly its jobs moved", worker.id);
        assert!(!moved.is_empty(), "{} held jobs", worker.id);
    }
    notifier.await.unwrap();

    let workers = second.workers().await.unwrap();
    assert_eq!(workers.len(), 4, "{workers:?}");
    assert!(workers.iter().all(|w| w.release == v2), "every worker runs the new release: {workers:?}");
    let all = calls.all();
    assert_no_overlap(&all);
    // Each job moved once: one first start and one requeued start.
    let mut starts: HashMap<&str, (usize, usize)> = HashMap::new();
    for call in &all {
        if let Call::Start { key, requeued, .. } = call {
            let entry = starts.entry(key).or_default();
            if *requeued { entry.1 += 1 } else { entry.0 += 1 }
        }
    }
    assert_eq!(starts.len(), JOBS);
    for (key, counts) in &starts {
        assert_eq!(*counts, (1, 1), "{key}: (first starts, requeued starts)");
    }
    for i in 0..100 {
        let key = format!("job-{i}");
        let notes: Vec<String> = all
            .iter()
            .filter_map(|call| match call {
                Call::Notify { key: k, payload, .. } if *k == key => {
                    Some(String::from_utf8(payload.clone()).unwrap())
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            notes,
            ["1", "2", "3", "4", "5", "6", "7", "8"],
            "{key}: every notification, once, in order"
        );
    }
    finish(&pool, &[&*first, &second]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_start_goes_with_its_events_and_its_dispatcher_to_the_heir_when_its_worker_is_replaced() {
    let pool = unique("held");
    let calls = crate::Calls::default();
    let node = std::sync::Arc::new(node(&pool, 1, &calls).await);
    let holder = node.workers().await.unwrap()[0].id.clone();
    // The start is held: the dispatch waits for an answer, and the
    // notifications sent meanwhile wait behind the start.
    let dispatch = tokio::spawn({
        let node = node.clone();
        async move { node.dispatch("h1", b"held").await.unwrap() }
    });
    calls.wait_until("the start was tried", |c| c.iter().any(|c| matches!(c, Call::Start { .. }))).await;
    let notifies: Vec<_> = (1..=3)
        .map(|n| {
            let node = node.clone();
            tokio::spawn(async move { node.notify("h1", format!("n{n}").as_bytes()).await.unwrap() })
        })
        .collect();
    // All three reach the holder's inbox (the job's sequence number is 3)
    // before it is replaced: they go with the job, not after it.
    wait_for_seq(&pool, "h1", 3).await;
    let status = node.status("h1").await.unwrap().unwrap();
    assert_eq!(status.state, pulse_pool::JobState::Running, "a held start is the worker's: {status:?}");

    let heir = node.replace_worker(&holder, Recording::new(&calls), WorkerOptions::default()).await.unwrap();
    assert_eq!(dispatch.await.unwrap(), DispatchOutcome::Started, "the heir answered the dispatcher");
    for notify in notifies {
        assert_eq!(notify.await.unwrap(), EventOutcome::Done);
    }
    let on_heir: Vec<Call> = calls
        .of("h1")
        .into_iter()
        .filter(|c| matches!(c, Call::Start { worker, .. } | Call::Notify { worker, .. } if *worker == heir))
        .collect();
    assert!(
        matches!(&on_heir[0], Call::Start { requeued: true, attempt: 1, .. }),
        "started again, no attempt counted: {on_heir:?}"
    );
    let notified: Vec<Vec<u8>> = on_heir[1..]
        .iter()
        .map(|c| match c {
            Call::Notify { payload, .. } => payload.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(notified.len(), 3, "{on_heir:?}");
    let status = node.status("h1").await.unwrap().unwrap();
    assert_eq!((status.state, status.attempt), (pulse_pool::JobState::Running, 1));
    assert!(
        !calls.of("h1").iter().any(|c| matches!(c, Call::Notify { worker, .. } if *worker == holder)),
        "the holder never called notify"
    );
    finish(&pool, &[&node]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_notification_goes_with_its_running_job_and_the_events_after_it_to_the_heir() {
    let pool = unique("held_notify");
    let calls = crate::Calls::default();
    pulse_testkit::init_tracing();
    let node =
        std::sync::Arc::new(pulse_pool::Node::join(&crate::client(), &pool, crate::options()).await.unwrap());
    let holder = node.add_worker(Recording::holding(&calls)).await.unwrap();
    assert_eq!(node.dispatch("r1", b"").await.unwrap(), DispatchOutcome::Started);
    // The first notification is held; the next two wait behind it.
    let first = tokio::spawn({
        let node = node.clone();
        async move { node.notify("r1", b"hold").await.unwrap() }
    });
    calls
        .wait_until("the notification reached the holder", |c| {
            c.iter().any(|c| matches!(c, Call::Notify { .. }))
        })
        .await;
    let later: Vec<_> = ["n2", "n3"]
        .into_iter()
        .map(|payload| {
            let node = node.clone();
            tokio::spawn(async move { node.notify("r1", payload.as_bytes()).await.unwrap() })
        })
        .collect();
    wait_for_seq(&pool, "r1", 3).await;

    let heir = node.replace_worker(&holder, Recording::new(&calls), WorkerOptions::default()).await.unwrap();
    assert_eq!(first.await.unwrap(), EventOutcome::Done, "the heir answered the held notification");
    for notify in later {
        assert_eq!(notify.await.unwrap(), EventOutcome::Done);
    }
    let on_heir: Vec<Call> = calls
        .of("r1")
        .into_iter()
        .filter(|c| matches!(c, Call::Start { worker, .. } | Call::Notify { worker, .. } if *worker == heir))
        .collect();
    assert!(matches!(&on_heir[0], Call::Start { requeued: true, attempt: 1, .. }), "{on_heir:?}");
    let payloads: Vec<&[u8]> = on_heir[1..]
        .iter()
        .map(|c| match c {
            Call::Notify { payload, .. } => payload.as_slice(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(payloads.len(), 3, "{on_heir:?}");
    assert_eq!(payloads[0], b"hold", "the held notification first");
    let on_holder = calls
        .of("r1")
        .into_iter()
        .filter(|c| matches!(c, Call::Notify { worker, .. } if *worker == holder))
        .count();
    assert_eq!(on_holder, 1, "the holder saw only the notification it held");
    finish(&pool, &[&node]).await;
}

/// Waits until job `key` of `pool` has had `seq` events sent to it (its
/// sequence number in the jobs hash): they are in its worker's inbox.
async fn wait_for_seq(pool: &str, key: &str, seq: u64) {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let deadline = tokio::time::Instant::now() + crate::PATIENCE;
    loop {
        let ownership: String = redis::cmd("HGET")
            .arg(format!("pulse:{{{pool}}}:jobs"))
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if ownership.ends_with(&format!("|{seq}")) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{seq} events were not sent to {key}: {ownership}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
