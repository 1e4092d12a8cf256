//! What the runtime refuses to load or to be configured with.

use pulse_runtime::{EngineError, Limits, LoadError, PluginOptions, Runtime, RuntimeConfig};
use pulse_testkit::plugins::{ECHO, WRONG_WORLD};

use crate::runtime;

fn load_bytes(bytes: &[u8]) -> LoadError {
    runtime().load("broken", bytes, PluginOptions::default()).unwrap_err()
}

#[test]
fn a_component_of_another_world_is_refused_naming_the_missing_export() {
    let path = pulse_testkit::plugins::path(WRONG_WORLD);
    let error = runtime().load_file("greeter", &path, PluginOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LoadError::WrongWorld { .. }), "{message}");
    assert!(message.contains("\"greeter\"") && message.contains("pulse:job/handler"), "{message}");
}

#[test]
fn a_component_with_an_unknown_import_is_refused_naming_it() {
    let component =
        wat::parse_str(r#"(component (import "acme:secret/vault" (instance (export "open" (func)))))"#)
            .unwrap();
    let error = load_bytes(&component);
    let message = error.to_string();
    assert!(matches!(error, LoadError::WrongWorld { .. }), "{message}");
    assert!(message.contains("acme:secret/vault"), "{message}");
}

#[test]
fn a_core_module_and_garbage_are_refused_for_what_they_are() {
    let module = wat::parse_str("(module)").unwrap();
    assert!(matches!(load_bytes(&module), LoadError::CoreModule { .. }));
    assert!(matches!(load_bytes(b"#!/bin/sh\necho hi\n"), LoadError::NotWasm { .. }));
    assert!(matches!(load_bytes(b""), LoadError::NotWasm { .. }));
    let truncated = &module[..6];
    assert!(matches!(load_bytes(truncated), LoadError::CoreModule { .. }));
}

#[test]
fn a_missing_file_is_refused_with_its_path() {
    let error = runtime()
        .load_file("ghost", "/nonexistent/ghost.wasm".as_ref(), PluginOptions::default())
        .unwrap_err();
    assert!(error.to_string().contains("ghost"), "{error}");
    assert!(matches!(error, LoadError::Read { .. }));
}

#[test]
fn plugin_limits_beyond_the_runtime_are_refused() {
    let runtime = Runtime::new(RuntimeConfig::default().max_memory_per_instance(32 << 20)).unwrap();
    let path = pulse_testkit::plugins::path(ECHO);
    let options =
        PluginOptions { limits: Limits { memory: 64 << 20, ..Limits::default() }, ..Default::default() };
    let error = runtime.load_file("echo", &path, options).unwrap_err();
    assert!(matches!(error, LoadError::InvalidOptions { .. }), "{error}");
    assert!(error.to_string().contains("max_memory_per_instance"), "{error}");

    let limits = Limits { fuel: Some(1), memory: 16 << 20, ..Limits::default() };
    let options = PluginOptions { limits, ..Default::default() };
    let error = runtime.load_file("echo", &path, options).unwrap_err();
    assert!(error.to_string().contains("fuel"), "{error}");
}

#[test]
fn pool_sizes_that_cannot_fit_are_refused() {
    let error = RuntimeConfig::default().max_instances(1_000_000).validate().unwrap_err();
    assert!(matches!(error, EngineError::Invalid(_)));
    assert!(error.to_string().contains("max_instances"), "{error}");
    // With a small reservation per instance, the kernel's map limit decides.
    let small = RuntimeConfig::default().memory_reservation(64 << 20).max_memory_per_instance(64 << 20);
    let error = small.max_instances(500_000).validate().unwrap_err();
    assert!(error.to_string().contains("vm.max_map_count"), "{error}");
    assert!(RuntimeConfig::default().max_instances(0).validate().is_err());
}
