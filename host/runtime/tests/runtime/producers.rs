//! Job producers: the `keeper` plugin's plans, its answers, and components
//! of the wrong world refused.

use std::collections::BTreeMap;

use pulse_runtime::{CallError, JobError, LoadError, Plan, PlanAnswer, PluginOptions, ProducerOptions};
use pulse_testkit::plugins::{ECHO, KEEPER, PYTHON_KEEPER, path};

use crate::runtime;

/// The keeper in Rust and in Python (`python-keeper`): the same plans.
const KEEPERS: [&str; 2] = [KEEPER, PYTHON_KEEPER];

fn keeper(name: &str, settings: &[(&str, &str)]) -> pulse_runtime::Producer {
    let settings: BTreeMap<String, String> =
        settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    // Python's interpreter compiles once into the cache the tests share.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache");
    pulse_runtime::Runtime::new(pulse_runtime::RuntimeConfig::default().cache_dir(cache))
        .unwrap()
        .load_producer_file(name, &path(name), ProducerOptions { settings, ..ProducerOptions::default() })
        .unwrap()
}

#[tokio::test]
async fn the_keeper_plans_one_job_per_entry_of_its_list() {
    for name in KEEPERS {
        let answer = keeper(name, &[("jobs", "a, b=hello ,,c")]).plan().await.unwrap();
        let expected = Plan {
            start: vec![
                ("a".into(), b"a".to_vec()),
                ("b".into(), b"hello".to_vec()),
                ("c".into(), b"c".to_vec()),
            ],
            stop: Vec::new(),
            stop_all: true,
        };
        assert_eq!(answer, PlanAnswer::Plan(expected), "{name}");
    }
}

#[tokio::test]
async fn a_producer_answers_failed_and_finished() {
    for name in KEEPERS {
        let error = keeper(name, &[]).plan().await.unwrap_err();
        assert!(
            matches!(&error, CallError::Guest(JobError::Retryable(message)) if message.contains("`jobs` is missing")),
            "{name}: {error}"
        );
        assert_eq!(
            keeper(name, &[("finished", "true")]).plan().await.unwrap(),
            PlanAnswer::Finished,
            "{name}"
        );
    }
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
