//! Job producers: the `keeper` plugin's plans, its answers, and components
//! of the wrong world refused.

use std::collections::BTreeMap;

use pulse_runtime::{CallError, JobError, LoadError, Plan, PlanAnswer, PluginOptions, ProducerOptions};
use pulse_testkit::plugins::{ECHO, KEEPER, path};

use crate::runtime;

fn keeper(settings: &[(&str, &str)]) -> pulse_runtime::Producer {
    let settings: BTreeMap<String, String> =
        settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    runtime()
        .load_producer_file(
            "keeper",
            &path(KEEPER),
            ProducerOptions { settings, ..ProducerOptions::default() },
        )
        .unwrap()
}

#[tokio::test]
async fn the_keeper_plans_one_job_per_entry_of_its_list() {
    let answer = keeper(&[("jobs", "a, b=hello ,,c")]).plan().await.unwrap();
    let expected = Plan {
        start: vec![
            ("a".into(), b"a".to_vec()),
            ("b".into(), b"hello".to_vec()),
            ("c".into(), b"c".to_vec()),
        ],
        stop: Vec::new(),
        stop_all: true,
    };
    assert_eq!(answer, PlanAnswer::Plan(expected));
}

#[tokio::test]
async fn a_producer_answers_failed_and_finished() {
    let error = keeper(&[]).plan().await.unwrap_err();
    assert!(
        matches!(&error, CallError::Guest(JobError::Retryable(message)) if message.contains("`jobs` is missing")),
        "{error}"
    );
    assert_eq!(keeper(&[("finished", "true")]).plan().await.unwrap(), PlanAnswer::Finished);
}

#[test]
fn a_handler_is_not_a_producer_nor_a_producer_a_handler() {
    let error = runtime().load_producer_file("echo", &path(ECHO), ProducerOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LoadError::WrongWorld { world: "job-producer", .. }), "{message}");
    assert!(message.contains("pulse:job/producer"), "{message}");
    let error = runtime().load_file("keeper", &path(KEEPER), PluginOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LoadError::WrongWorld { world: "job-handler", .. }), "{message}");
    assert!(message.contains("pulse:job/handler"), "{message}");
}
