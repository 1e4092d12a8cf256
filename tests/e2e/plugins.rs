//! The plugins are built from source as WebAssembly components, and the
//! annotated `config.toml` names plugins that exist.

use std::path::Path;

use pulse_testkit::plugins;

/// `\0asm`, then version 0x0d 0x00 and layer 0x01 0x00: a component. A core
/// module has version 1 and layer 0.
const COMPONENT_PREAMBLE: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

#[test]
fn every_plugin_is_a_component() {
    for name in plugins::ALL {
        let bytes = std::fs::read(plugins::path(name)).unwrap();
        assert!(
            bytes.starts_with(&COMPONENT_PREAMBLE),
            "plugin {name} is not a WebAssembly component (starts with {:02x?})",
            &bytes[..bytes.len().min(8)]
        );
    }
}

#[test]
fn config_toml_lists_plugins_that_are_built() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("config.toml")).unwrap();
    let config: toml::Table = toml::from_str(&text).unwrap();
    let listed = config["plugin"].as_array().expect("config.toml has [[plugin]] tables");
    assert!(!listed.is_empty());
    for plugin in listed {
        let path = plugin["path"].as_str().expect("every plugin has a path");
        let path = root.join(path);
        assert!(path.is_file(), "config.toml names {}, which the build does not produce", path.display());
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(&COMPONENT_PREAMBLE), "{} is not a component", path.display());
    }
}
