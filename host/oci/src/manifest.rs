//! The JSON a registry keeps: an image manifest and the descriptors in
//! it (only the fields this host reads or writes).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// OCI's image manifest media type.
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The oci-wasm config media type.
pub(crate) const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The oci-wasm layer media type: the component's bytes.
pub(crate) const WASM_LAYER: &str = "application/wasm";

/// An image manifest.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    pub(crate) schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) media_type: Option<String>,
    pub(crate) config: Descriptor,
    #[serde(default)]
    pub(crate) layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// A blob named in a manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

impl Descriptor {
    pub(crate) fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.to_owned(),
            digest: crate::digest(bytes),
            size: bytes.len() as u64,
            annotations: BTreeMap::new(),
        }
    }
}

impl Manifest {
    pub(crate) fn new(config: Descriptor, layers: Vec<Descriptor>) -> Self {
        Self {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_owned()),
            config,
            layers,
            annotations: BTreeMap::new(),
        }
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest serialises")
    }

    /// The one `application/wasm` layer, or why there is none.
    pub(crate) fn component_layer(&self) -> Result<&Descriptor, String> {
        let wasm: Vec<_> = self.layers.iter().filter(|l| l.media_type == WASM_LAYER).collect();
        match wasm.as_slice() {
            [layer] => Ok(layer),
            [] => {
                let types: Vec<_> = self.layers.iter().map(|l| l.media_type.as_str()).collect();
                Err(format!(
                    "not a wasm component: its manifest has no {WASM_LAYER} layer (config {}, layers {types:?}); \
                     publish components with `pulse-host push`",
                    self.config.media_type
                ))
            }
            _ => {
                Err(format!("its manifest has {} {WASM_LAYER} layers; a plugin is one component", wasm.len()))
            }
        }
    }
}
