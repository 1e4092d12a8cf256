//! Instances made ahead of need (job isolation): a start takes one, and it
//! is then the job's own; they never take room a start needs.

use std::time::Duration;

use pulse_runtime::{Isolation, Job, Limits, Output, Plugin, Runtime, RuntimeConfig};
use pulse_testkit::plugins::{COUNTER, ECHO};

use crate::{PATIENCE, load, options, runner, runtime};

/// Waits until `plugin` has `ready` instances made ahead of need.
async fn until_ready(plugin: &Plugin, ready: usize) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while plugin.ready_instances().ready != ready {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{:?} after {PATIENCE:?}, not {ready} ready", plugin.ready_instances());
}

#[tokio::test]
async fn a_start_takes_an_instance_made_ahead_of_need_and_its_emits_and_timers_are_the_job_s() {
    let runtime = runtime();
    let plugin = load(&runtime, COUNTER, options(Isolation::Job, &[("interval-ms", "20")]));
    assert_eq!(plugin.ready_instances().ready, 0, "none before a first start");
    let (first, first_out) = runner(&plugin);
    first.start(Job::new("a", "1000")).await.unwrap();
    until_ready(&plugin, 1).await;

    // Another worker's runner: its job runs in the instance made after
    // the first start, and what it writes is its own.
    let (second, second_out) = runner(&plugin);
    second.start(Job::new("b", "3")).await.unwrap();
    assert_eq!(plugin.ready_instances().taken, 1, "{:?}", plugin.ready_instances());
    second_out
        .wait_until(PATIENCE, |o| o.iter().any(|o| matches!(o, Output::Complete { key } if key == "b")))
        .await;
    assert!(second_out.emitted("b").len() >= 3, "b's ticks emit: {:?}", second_out.emitted("b"));
    assert!(first_out.emitted("b").is_empty(), "b's writes reached another worker's outputs");
    assert!(second_out.emitted("a").is_empty());
    first.close().await;
    second.close().await;
}

#[tokio::test]
async fn instances_made_ahead_of_need_keep_within_the_quota_and_a_start_takes_them_first() {
    let runtime = runtime();
    let limits = Limits { instances: Some(2), ..Limits::default() };
    let plugin =
        load(&runtime, ECHO, pulse_runtime::PluginOptions { limits, ..options(Isolation::Job, &[]) });
    let (runner, _) = runner(&plugin);
    runner.start(Job::new("a", "")).await.unwrap();
    // The second unit of the quota is held ready, and the next start takes it.
    until_ready(&plugin, 1).await;
    runner.start(Job::new("b", "")).await.unwrap();
    assert_eq!(plugin.ready_instances(), pulse_runtime::ReadyInstances { ready: 0, taken: 1 });
    let refused = runner.start(Job::new("c", "")).await.unwrap_err();
    assert!(refused.to_string().contains("instance"), "{refused}");
    runner.stop("a").await.unwrap();
    runner.start(Job::new("c", "")).await.unwrap();
    runner.close().await;
}

#[tokio::test]
async fn a_start_refused_for_room_frees_what_another_plugin_holds_ready() {
    // Two instances in the whole runtime: one running job of `counter`,
    // and the one made ready after it.
    let runtime = Runtime::new(RuntimeConfig::default().max_instances(2)).unwrap();
    let counter = load(&runtime, COUNTER, options(Isolation::Job, &[("interval-ms", "60000")]));
    let echo = load(&runtime, ECHO, options(Isolation::Job, &[]));
    let (counters, _) = runner(&counter);
    counters.start(Job::new("a", "1000")).await.unwrap();
    until_ready(&counter, 1).await;

    let (echoes, echoed) = runner(&echo);
    echoes.start(Job::new("e", "hello")).await.unwrap();
    assert_eq!(echoed.emitted("e"), [b"hello".to_vec()]);
    assert_eq!(counter.ready_instances().ready, 0, "counter's ready instance gave its room");
    counters.close().await;
    echoes.close().await;
}

#[tokio::test]
async fn ready_instances_zero_keeps_none_and_more_than_the_most_is_refused() {
    let runtime = Runtime::new(RuntimeConfig::default().ready_instances(0)).unwrap();
    let plugin = load(&runtime, ECHO, options(Isolation::Job, &[]));
    let (runner, _) = runner(&plugin);
    for key in ["a", "b", "c"] {
        runner.start(Job::new(key, "")).await.unwrap();
        runner.notify(key, b"x".to_vec()).await.unwrap();
    }
    assert_eq!(plugin.ready_instances(), pulse_runtime::ReadyInstances { ready: 0, taken: 0 });
    runner.close().await;

    let error = RuntimeConfig::default().ready_instances(65).validate().unwrap_err();
    assert!(error.to_string().contains("ready_instances must be 0 to 64, got 65"), "{error}");
}

#[tokio::test]
async fn a_plugin_without_starts_drops_its_ready_instances() {
    let runtime = runtime();
    let plugin = load(&runtime, ECHO, options(Isolation::Job, &[]));
    let (runner, _) = runner(&plugin);
    runner.start(Job::new("a", "")).await.unwrap();
    until_ready(&plugin, 1).await;
    // Ten seconds without a start (PATIENCE is twice that).
    until_ready(&plugin, 0).await;
    runner.start(Job::new("b", "")).await.unwrap();
    until_ready(&plugin, 1).await;
    runner.close().await;
}
