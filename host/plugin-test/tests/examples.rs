//! The example plugins (`echo`, `counter`), tested as their authors would
//! test them: with the harness, on a paused clock.
#![allow(clippy::unwrap_used, reason = "tests: a panic is the failure report")]

use std::time::Duration;

use pulse_plugin_test::{CallError, Harness, Output};
use pulse_testkit::plugins::{COUNTER, ECHO, path};

#[tokio::test(start_paused = true)]
async fn echo_emits_each_payload_behind_its_prefix() {
    let mut echo = Harness::load(path(ECHO)).setting("prefix", "> ").build().unwrap();
    echo.start("e1", "hello").await.unwrap();
    echo.notify("e1", "again").await.unwrap();
    assert_eq!(echo.emitted("e1"), ["> hello", "> again"]);
    echo.stop("e1").await.unwrap();
    assert!(!echo.is_running("e1"));
    assert!(matches!(echo.notify("e1", "late").await, Err(CallError::NotRunning(_))));
}

#[tokio::test(start_paused = true)]
async fn counter_ticks_resumes_from_its_saved_state_after_a_move_and_completes_at_its_target() {
    let mut counter = Harness::load(path(COUNTER)).setting("interval-ms", "1000").build().unwrap();
    counter.start("c1", "5").await.unwrap();
    counter.advance(Duration::from_millis(3_500)).await;
    assert_eq!(counter.emitted("c1"), ["1", "2", "3"]);
    assert_eq!(counter.saved_state("c1").as_deref(), Some(&b"3"[..]));

    // A new instance takes it over from the state it saved.
    counter.crash_and_move("c1").await.unwrap();
    counter.advance(Duration::from_secs(3)).await;
    assert_eq!(counter.emitted("c1"), ["1", "2", "3", "4", "5"]);
    assert!(matches!(counter.outputs().last(), Some(Output::Complete { key }) if key == "c1"));
    assert!(!counter.is_running("c1"));
}

#[tokio::test(start_paused = true)]
async fn counter_refuses_a_payload_and_a_notification_it_does_not_understand() {
    let mut counter = Harness::load(path(COUNTER)).build().unwrap();
    let refused = counter.start("c2", "many").await.unwrap_err();
    assert!(refused.to_string().contains("payload must be empty or a number"), "{refused}");
    counter.start("c3", "").await.unwrap();
    let refused = counter.notify("c3", "faster").await.unwrap_err();
    assert!(refused.to_string().contains("reset"), "{refused}");
}

#[test]
fn a_component_of_another_world_is_refused_with_its_reason() {
    let error = Harness::load(path(pulse_testkit::plugins::WRONG_WORLD)).build().unwrap_err();
    assert!(error.contains("wrong_world"), "{error}");
}
