//! A thousand live per-job instances in one process, and what they cost.

use pulse_runtime::{Isolation, Job, MAPPINGS_PER_INSTANCE};
use pulse_testkit::plugins::ECHO;

use crate::{load, options, runner, runtime};

const INSTANCES: usize = 1_000;

#[tokio::test]
async fn a_thousand_per_job_instances_live_at_once_and_each_answers() {
    let runtime = runtime();
    let plugin = load(&runtime, ECHO, options(Isolation::Job, &[]));
    let (runner, recorder) = runner(&plugin);
    let maps_before = mappings();

    for i in 0..INSTANCES {
        runner.start(Job::new(format!("job-{i}"), "")).await.unwrap();
    }
    assert_eq!(runner.running().len(), INSTANCES);
    let maps_live = mappings();
    for i in 0..INSTANCES {
        runner.notify(&format!("job-{i}"), format!("{i}").into_bytes()).await.unwrap();
    }
    for i in (0..INSTANCES).step_by(97) {
        let key = format!("job-{i}");
        assert_eq!(recorder.emitted(&key), [Vec::new(), format!("{i}").into_bytes()]);
    }

    let per_instance = maps_live.saturating_sub(maps_before) as f64 / INSTANCES as f64;
    eprintln!("memory mappings per live instance: {per_instance:.2}");
    assert!(
        per_instance <= MAPPINGS_PER_INSTANCE as f64,
        "{per_instance:.2} mappings per instance exceed the {MAPPINGS_PER_INSTANCE} the configuration check assumes"
    );
    for i in 0..INSTANCES {
        runner.stop(&format!("job-{i}")).await.unwrap();
    }
    assert!(runner.running().is_empty());
}

/// Lines of `/proc/self/maps`: the process's memory mappings.
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().count()
}
