//! Dispatch: routing, outcomes, unique keys, queued jobs, failures.

use std::collections::HashSet;

use pulse_pool::hash::{VIRTUAL_SLOTS, slot_of};
use pulse_pool::{DispatchOutcome, Error, JobState, Node};
use pulse_testkit::unique;

use crate::{Call, Calls, PATIENCE, Recording, client, finish, node, options};

#[tokio::test]
async fn every_job_starts_on_the_worker_its_key_routes_to() {
    let pool = unique("routing");
    let calls = Calls::default();
    let node = node(&pool, 4, &calls).await;
    for i in 0..200 {
        assert_eq!(node.dispatch(&format!("job-{i}"), b"x").await.unwrap(), DispatchOutcome::Started);
    }
    let table = crate::membership::slot_table(&pool).await;
    crate::membership::assert_balanced(&table, 4);
    for call in calls.all() {
        let Call::Start { worker, key, .. } = call else { panic!("only starts expected") };
        assert_eq!(worker, table[&slot_of(&key, VIRTUAL_SLOTS)], "{key} runs where its key routes");
        assert_eq!(node.owner(&key), Some(worker), "the node routes {key} by the same table");
    }
    let listed = node.jobs().await.unwrap();
    assert_eq!(listed.len(), 200);
    assert!(listed.iter().all(|j| j.state == JobState::Running && j.worker.is_some() && j.created_at_ms > 0));
    assert_eq!(node.workers().await.unwrap().iter().map(|w| w.jobs).sum::<u64>(), 200);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_key_is_unique_until_its_job_ends() {
    let pool = unique("unique_keys");
    let calls = Calls::default();
    let node = node(&pool, 2, &calls).await;
    assert_eq!(node.dispatch("k", b"1").await.unwrap(), DispatchOutcome::Started);
    assert_eq!(node.dispatch("k", b"2").await.unwrap(), DispatchOutcome::AlreadyExists(JobState::Running));
    assert_eq!(calls.starts(), 1);
    node.stop("k").await.unwrap();
    assert_eq!(node.dispatch("k", b"3").await.unwrap(), DispatchOutcome::Started);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_job_dispatched_without_workers_waits_and_starts_when_one_joins() {
    let pool = unique("queued");
    let calls = Calls::default();
    let client_node = Node::client(&client(), &pool, options()).await.unwrap();
    assert_eq!(client_node.dispatch("waiting", b"hello").await.unwrap(), DispatchOutcome::Queued);
    assert_eq!(client_node.status("waiting").await.unwrap().unwrap().state, JobState::Queued);
    assert!(matches!(client_node.add_worker(Recording::new(&calls)).await, Err(Error::ClientOnly)));

    let full = node(&pool, 1, &calls).await;
    calls.wait_until("the queued job starts", |c| !c.is_empty()).await;
    assert!(
        matches!(&calls.all()[0], Call::Start { key, payload, .. } if key == "waiting" && payload == b"hello")
    );
    crate::wait_for_state(&client_node, "waiting", JobState::Running).await;
    finish(&pool, &[&full, &client_node]).await;
}

#[tokio::test]
async fn a_refused_job_is_not_kept_and_a_fatal_one_is_listed_failed() {
    let pool = unique("refusals");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    assert_eq!(
        node.dispatch("r", b"refuse").await.unwrap(),
        DispatchOutcome::Refused("refused on purpose".into())
    );
    assert_eq!(node.status("r").await.unwrap(), None, "a refused job is not kept");

    assert_eq!(
        node.dispatch("f", b"fatal").await.unwrap(),
        DispatchOutcome::Failed("failed on purpose".into())
    );
    let failed = node.status("f").await.unwrap().unwrap();
    assert_eq!(failed.state, JobState::Failed);
    assert_eq!(failed.reason.as_deref(), Some("failed on purpose"));
    assert_eq!(node.dispatch("f", b"again").await.unwrap(), DispatchOutcome::AlreadyExists(JobState::Failed));
    assert!(node.forget("f").await.unwrap());
    assert_eq!(node.dispatch("f", b"fine").await.unwrap(), DispatchOutcome::Started);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_retryable_failure_is_retried_up_to_max_attempts_then_failed() {
    let pool = unique("retries");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    assert_eq!(node.dispatch("once", b"retry-once").await.unwrap(), DispatchOutcome::Started);
    let attempts: Vec<u32> = calls
        .of("once")
        .iter()
        .filter_map(|c| if let Call::Start { attempt, .. } = c { Some(*attempt) } else { None })
        .collect();
    assert_eq!(attempts, [1, 2]);

    assert_eq!(node.dispatch("never", b"retry").await.unwrap(), DispatchOutcome::Failed("not yet".into()));
    let attempts: Vec<u32> = calls
        .of("never")
        .iter()
        .filter_map(|c| if let Call::Start { attempt, .. } = c { Some(*attempt) } else { None })
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    let failed = node.status("never").await.unwrap().unwrap();
    assert_eq!((failed.state, failed.attempt), (JobState::Failed, 3));

    // An operator retries it: it starts again from attempt 1.
    assert!(node.retry("never").await.unwrap());
    calls
        .wait_until("the retried job starts again", |c| {
            c.iter().filter(|c| matches!(c, Call::Start { key, attempt: 1, .. } if key == "never")).count()
                == 2
        })
        .await;
    crate::wait_for_state(&node, "never", JobState::Running).await;
    let history = node.status("never").await.unwrap().unwrap().history;
    let history: Vec<(&str, Option<&str>)> =
        history.iter().map(|e| (e.event.as_str(), e.worker.as_deref())).collect();
    assert_eq!(
        history,
        [("dispatched", None), ("failed", Some("w1")), ("retried", None), ("started", Some("w1"))],
        "its history"
    );
    let _ = PATIENCE;
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn invalid_keys_and_payloads_are_refused_with_what_is_allowed() {
    let pool = unique("limits");
    let node = Node::client(&client(), &pool, options()).await.unwrap();
    for (key, needle) in [("", "empty"), ("tab\there", "control"), (&"k".repeat(300) as &str, "limit")] {
        let error = node.dispatch(key, b"").await.unwrap_err();
        assert!(matches!(error, Error::InvalidKey { .. }), "{error}");
        assert!(error.to_string().contains(needle), "{error}");
    }
    let error = node.dispatch("big", &vec![0; (1 << 20) + 1]).await.unwrap_err();
    assert!(matches!(error, Error::PayloadTooLarge { .. }), "{error}");
    assert!(matches!(Node::client(&client(), "bad pool", options()).await, Err(Error::InvalidPool(_))));
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_full_pool_refuses_new_jobs() {
    let pool = unique("full");
    let calls = Calls::default();
    let node =
        Node::join(&client(), &pool, pulse_pool::NodeOptions { max_jobs: 3, ..options() }).await.unwrap();
    node.add_worker(Recording::new(&calls)).await.unwrap();
    for i in 0..3 {
        assert_eq!(node.dispatch(&format!("j{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    assert_eq!(node.dispatch("j3", b"").await.unwrap(), DispatchOutcome::PoolFull);
    node.stop("j0").await.unwrap();
    assert_eq!(node.dispatch("j3", b"").await.unwrap(), DispatchOutcome::Started);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_job_that_completes_itself_frees_its_key() {
    let pool = unique("complete");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    assert_eq!(node.dispatch("done", b"complete").await.unwrap(), DispatchOutcome::Started);
    assert_eq!(node.status("done").await.unwrap(), None);
    assert_eq!(node.stop("done").await.unwrap(), pulse_pool::EventOutcome::NoSuchJob);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn concurrent_dispatches_of_one_key_start_it_once() {
    let pool = unique("race");
    let calls = Calls::default();
    let a = node(&pool, 2, &calls).await;
    let b = Node::client(&client(), &pool, options()).await.unwrap();
    let attempts = (0..20).map(|i| {
        let node = if i % 2 == 0 { &a } else { &b };
        async move { node.dispatch("contested", format!("{i}").as_bytes()).await.unwrap() }
    });
    let outcomes = futures_util::future::join_all(attempts).await;
    let started = outcomes.iter().filter(|o| **o == DispatchOutcome::Started).count();
    let exists = outcomes.iter().filter(|o| **o == DispatchOutcome::AlreadyExists(JobState::Running)).count();
    assert_eq!((started, exists), (1, 19), "{outcomes:?}");
    assert_eq!(calls.starts(), 1);
    let _ = PATIENCE;
    finish(&pool, &[&a, &b]).await;
}

#[tokio::test]
async fn counts_by_state_and_pages_of_jobs_cover_the_pool() {
    let pool = unique("counting");
    let calls = Calls::default();
    let waiting = Node::client(&client(), &pool, options()).await.unwrap();
    assert_eq!(waiting.dispatch("early", b"x").await.unwrap(), DispatchOutcome::Queued);
    let counts = waiting.job_counts().await.unwrap();
    assert_eq!((counts.running, counts.queued, counts.failed), (0, 1, 0));

    let node = node(&pool, 3, &calls).await;
    calls.wait_until("the queued job starts", |c| !c.is_empty()).await;
    for i in 0..57 {
        assert_eq!(node.dispatch(&format!("job-{i}"), b"x").await.unwrap(), DispatchOutcome::Started);
    }
    assert!(matches!(node.dispatch("broken", b"fatal").await.unwrap(), DispatchOutcome::Failed(_)));
    let counts = node.job_counts().await.unwrap();
    assert_eq!((counts.running, counts.queued, counts.failed), (58, 0, 1));

    // Pages of about 10 from cursor 0 until it comes back 0: every job.
    let mut keys = Vec::new();
    let mut cursor = 0;
    loop {
        let (next, page) = node.jobs_page(cursor, 10).await.unwrap();
        keys.extend(page.into_iter().map(|job| job.key));
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 59, "57 jobs, early and broken, each listed");

    // Listings filtered by key prefix and state, page by page, from a
    // node and from a view: the same jobs. Glob characters in a prefix
    // are taken as they are.
    for (key, payload) in [("glob*1", &b"x"[..]), ("globa1", b"x"), ("glob?", b"fatal")] {
        node.dispatch(key, payload).await.unwrap();
    }
    let view = pulse_pool::PoolView::open(&client(), &pool).await.unwrap();
    let every = |query: pulse_pool::JobsQuery| {
        let (node, view) = (&node, &view);
        async move {
            let (mut from_node, mut from_view) = (Vec::new(), Vec::new());
            for (pages, out) in [(true, &mut from_node), (false, &mut from_view)] {
                let mut query = query.clone();
                loop {
                    let page = match pages {
                        true => node.list_jobs(&query).await.unwrap(),
                        false => view.list_jobs(&query).await.unwrap(),
                    };
                    out.extend(page.jobs.into_iter().map(|job| (job.key, job.state.as_str())));
                    match page.next_cursor {
                        Some(next) => query.cursor = next,
                        None => break,
                    }
                }
                out.sort();
                out.dedup();
            }
            assert_eq!(from_node, from_view);
            from_node
        }
    };
    let query = |prefix: &str, state| pulse_pool::JobsQuery {
        state,
        prefix: prefix.to_owned(),
        limit: 4,
        ..Default::default()
    };
    let job_1 = every(query("job-1", None)).await;
    assert_eq!(job_1.len(), 11, "job-1 and job-10 to job-19: {job_1:?}");
    let keys: Vec<String> = every(query("glob*", None)).await.into_iter().map(|(key, _)| key).collect();
    assert_eq!(keys, ["glob*1"], "`*` is no wildcard in a prefix");
    let failed = every(query("", Some(pulse_pool::JobState::Failed))).await;
    let failed: Vec<&str> = failed.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(failed, ["broken", "glob?"]);
    assert!(every(query("nothing-", None)).await.is_empty());
    for key in ["glob*1", "globa1", "glob?"] {
        node.stop(key).await.unwrap();
        node.forget(key).await.unwrap();
    }
    node.forget("broken").await.unwrap();
    assert_eq!(node.job_counts().await.unwrap().failed, 0);
    finish(&pool, &[&node, &waiting]).await;
}

#[tokio::test]
async fn a_batch_starts_each_valid_job_once_and_answers_each_job_in_its_place() {
    let pool = unique("batch");
    let calls = Calls::default();
    let node = node(&pool, 3, &calls).await;
    assert_eq!(node.dispatch("taken", b"0").await.unwrap(), DispatchOutcome::Started);
    // The server forgets its scripts: the batch loads the one it needs.
    let mut conn = client().shared().await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
    let mut jobs: Vec<(String, Vec<u8>)> =
        (0..1500).map(|i| (format!("b-{i}"), format!("p{i}").into_bytes())).collect();
    jobs.insert(100, (String::new(), b"x".to_vec()));
    jobs.insert(1200, ("taken".into(), b"x".to_vec()));
    jobs.insert(1300, ("refused".into(), b"refuse".to_vec()));
    // A key twice in one batch: the second finds the first.
    jobs.push(("b-5".into(), b"again".to_vec()));
    let outcomes = node.dispatch_batch(&jobs).await;
    assert_eq!(outcomes.len(), jobs.len());
    for ((key, payload), outcome) in jobs.iter().zip(&outcomes) {
        match key.as_str() {
            "" => assert!(matches!(outcome, Err(Error::InvalidKey { .. })), "{outcome:?}"),
            "taken" | "b-5" if payload == b"x" || payload == b"again" => {
                assert_eq!(outcome.as_ref().unwrap(), &DispatchOutcome::AlreadyExists(JobState::Running));
            }
            "refused" => {
                assert_eq!(outcome.as_ref().unwrap(), &DispatchOutcome::Refused("refused on purpose".into()));
            }
            _ => assert_eq!(outcome.as_ref().unwrap(), &DispatchOutcome::Started, "{key}"),
        }
    }
    // The handlers saw each job of the batch start once, with its payload,
    // on the worker its key routes to.
    let mut started = std::collections::HashMap::new();
    for call in calls.all() {
        if let Call::Start { worker, key, payload, .. } = call
            && key.starts_with("b-")
        {
            assert_eq!(node.owner(&key), Some(worker), "{key} runs where its key routes");
            assert!(started.insert(key.clone(), payload).is_none(), "{key} started twice");
        }
    }
    assert_eq!(started.len(), 1500);
    assert!((0..1500).all(|i| started[&format!("b-{i}")] == format!("p{i}").into_bytes()));
    assert_eq!(node.jobs().await.unwrap().len(), 1501);
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_batch_without_workers_is_queued_and_starts_when_a_worker_joins() {
    let pool = unique("batch_queued");
    let calls = Calls::default();
    let client_node = Node::client(&client(), &pool, options()).await.unwrap();
    let jobs: Vec<(String, Vec<u8>)> = (0..20).map(|i| (format!("q-{i}"), vec![b'q'])).collect();
    let outcomes = client_node.dispatch_batch(&jobs).await;
    assert!(outcomes.iter().all(|o| matches!(o, Ok(DispatchOutcome::Queued))), "{outcomes:?}");
    // One worker: no job moves while the queued ones are assigned.
    let full = node(&pool, 1, &calls).await;
    calls.wait_until("the queued jobs start", |c| c.len() == 20).await;
    assert_eq!(full.jobs().await.unwrap().iter().filter(|j| j.state == JobState::Running).count(), 20);
    finish(&pool, &[&full, &client_node]).await;
}

#[tokio::test]
async fn single_dispatches_that_set_out_together_share_scripts_and_keep_their_own_outcomes() {
    // A private server: its command counts are this test's alone.
    let server = pulse_testkit::RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let calls = Calls::default();
    let node = Node::join(&client, "lanes", options()).await.unwrap();
    for _ in 0..3 {
        node.add_worker(Recording::new(&calls)).await.unwrap();
    }
    // The node's view of the slots holds all three before the dispatches
    // set out: the keys route to each of them.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while node.workers().await.unwrap().iter().filter(|w| w.slots > 0).count() < 3
        || (0..38).map(|i| node.owner(&format!("lane-{i}"))).collect::<HashSet<_>>().len() < 3
    {
        assert!(tokio::time::Instant::now() < deadline, "the three workers never all held slots");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut conn = server.connect().await;
    let before = crate::command_calls(&mut conn).await;

    // 40 dispatches at once to the pool's three workers, "twice" among
    // them twice: the second finds the first, as it would one by one.
    let mut keys: Vec<String> = (0..38).map(|i| format!("lane-{i}")).collect();
    keys.insert(5, "twice".into());
    keys.insert(20, "twice".into());
    let outcomes =
        futures_util::future::join_all(keys.iter().map(|key| node.dispatch(key, key.as_bytes()))).await;
    for (i, (key, outcome)) in keys.iter().zip(outcomes).enumerate() {
        let expected = if i == 20 {
            DispatchOutcome::AlreadyExists(JobState::Running)
        } else {
            DispatchOutcome::Started
        };
        assert_eq!(outcome.unwrap(), expected, "{key} (dispatch {i})");
    }
    assert_eq!(calls.starts(), 39);
    let mut workers = HashSet::new();
    for call in calls.all() {
        let Call::Start { key, payload, worker, .. } = call else { panic!("only starts expected") };
        assert_eq!(payload, key.as_bytes(), "each start carries its own payload");
        assert_eq!(node.owner(&key), Some(worker.clone()), "{key} started where it routes");
        workers.insert(worker);
    }
    assert_eq!(workers.len(), 3, "the starts reached every worker");
    // They set out together (this test's runtime runs the lane's task only
    // once every dispatch waits in it) and shared one script, whichever
    // worker each goes to; a lane per worker sends a script per worker.
    // Counted: every script on this server, the first refused once as not
    // yet loaded.
    let after = crate::command_calls(&mut conn).await;
    let scripts = after.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0);
    assert!(scripts <= 2, "{scripts} scripts for 40 dispatches to 3 workers");
    node.close().await;
}
