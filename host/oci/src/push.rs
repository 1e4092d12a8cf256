//! Publishing a component in the `oci-wasm` layout: a config of media
//! type `application/vnd.wasm.config.v0+json` (architecture `wasm`, os
//! `wasip2`, the layers' digests and the component's interfaces) and one
//! `application/wasm` layer holding the component's bytes.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::client::registry_message;
use crate::manifest::{Descriptor, Manifest, OCI_MANIFEST, WASM_CONFIG, WASM_LAYER};
use crate::{Client, Error, Reference, digest};

/// A component's interfaces, as the oci-wasm config lists them.
#[derive(Debug, Clone, Default)]
pub struct Interfaces {
    /// What it imports (`pulse:job/host@…`, `wasi:…`).
    pub imports: Vec<String>,
    /// What it exports (`pulse:job/handler@…`).
    pub exports: Vec<String>,
}

impl Interfaces {
    /// The names a component imports and exports at its top level; an
    /// error when `bytes` is not a component.
    pub fn of(bytes: &[u8]) -> Result<Self, Error> {
        use wasmparser::{Encoding, Parser, Payload};
        let not_a_component = |why: String| {
            Error::Usage(format!(
                "the file is not a WebAssembly component ({why}): build it for wasm32-wasip2 or with the \
                 language's componentize tool"
            ))
        };
        let mut interfaces = Self::default();
        let mut depth = 0usize;
        for payload in Parser::new(0).parse_all(bytes) {
            match payload.map_err(|error| not_a_component(error.to_string()))? {
                Payload::Version { encoding, .. } => {
                    if depth == 0 && encoding != Encoding::Component {
                        return Err(not_a_component("a core module".into()));
                    }
                    depth += 1;
                }
                Payload::End(_) => depth = depth.saturating_sub(1),
                Payload::ComponentImportSection(reader) if depth == 1 => {
                    for import in reader {
                        let import = import.map_err(|error| not_a_component(error.to_string()))?;
                        interfaces.imports.push(import.name.name.to_owned());
                    }
                }
                Payload::ComponentExportSection(reader) if depth == 1 => {
                    for export in reader {
                        let export = export.map_err(|error| not_a_component(error.to_string()))?;
                        interfaces.exports.push(export.name.name.to_owned());
                    }
                }
                _ => {}
            }
        }
        Ok(interfaces)
    }
}

/// What a push made.
#[derive(Debug)]
pub struct Pushed {
    /// Where it is, pinned to the manifest's digest (the tag kept).
    pub reference: Reference,
    /// The component's own digest.
    pub component_digest: String,
}

/// Publishes `component` at `reference` (a tag, or none: then the
/// manifest is reachable by its digest only).
pub async fn push(
    client: &Client,
    reference: &Reference,
    component: &[u8],
    annotations: BTreeMap<String, String>,
) -> Result<Pushed, Error> {
    if reference.digest.is_some() {
        return Err(Error::Usage(format!(
            "{reference}: a push names a repository and optionally a tag; the digest is the registry's answer"
        )));
    }
    let interfaces = Interfaces::of(component)?;
    let layer = Descriptor::of(WASM_LAYER, component);
    let config = serde_json::to_vec(&serde_json::json!({
        "created": rfc3339_now(),
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer.digest],
        "component": { "imports": interfaces.imports, "exports": interfaces.exports, "target": null },
    }))
    .expect("JSON serialises");
    upload_blob(client, reference, Bytes::copy_from_slice(component)).await?;
    upload_blob(client, reference, Bytes::from(config.clone())).await?;
    let mut manifest = Manifest::new(Descriptor::of(WASM_CONFIG, &config), vec![layer.clone()]);
    manifest.annotations = annotations;
    let bytes = manifest.to_bytes();
    let manifest_digest = digest(&bytes);
    let name = reference.tag.clone().unwrap_or_else(|| manifest_digest.clone());
    put_manifest(client, reference, &name, bytes).await?;
    Ok(Pushed { reference: reference.at(&manifest_digest), component_digest: layer.digest })
}

/// Uploads `bytes` as a blob unless the repository has it already
/// (monolithic upload: POST, then PUT with the digest).
pub(crate) async fn upload_blob(client: &Client, reference: &Reference, bytes: Bytes) -> Result<(), Error> {
    let blob = digest(&bytes);
    let base = reference.base_url();
    let head = client.send(reference, Method::HEAD, &format!("{base}/blobs/{blob}"), None, None, 0).await?;
    if head.status == StatusCode::OK {
        return Ok(());
    }
    let started =
        client.send(reference, Method::POST, &format!("{base}/blobs/uploads/"), None, None, 1 << 16).await?;
    expect(reference, &started, StatusCode::ACCEPTED, "starting an upload")?;
    let location =
        started.headers.get(http::header::LOCATION).and_then(|v| v.to_str().ok()).ok_or_else(|| {
            Error::Protocol {
                registry: reference.registry.clone(),
                detail: "it started an upload without a Location".into(),
            }
        })?;
    let base_uri: http::Uri = format!("{base}/blobs/uploads/").parse().expect("a valid URL");
    let location = crate::client::resolve(&base_uri, location);
    let separator = if location.contains('?') { '&' } else { '?' };
    let url = format!("{location}{separator}digest={}", blob.replace(':', "%3A"));
    let put = client
        .send(reference, Method::PUT, &url, None, Some(("application/octet-stream", bytes)), 1 << 16)
        .await?;
    expect(reference, &put, StatusCode::CREATED, &format!("uploading blob {blob}"))
}

/// Puts a manifest under `name` (a tag or its digest).
pub(crate) async fn put_manifest(
    client: &Client,
    reference: &Reference,
    name: &str,
    bytes: Vec<u8>,
) -> Result<(), Error> {
    let url = format!("{}/manifests/{name}", reference.base_url());
    let put = client
        .send(reference, Method::PUT, &url, None, Some((OCI_MANIFEST, Bytes::from(bytes))), 1 << 16)
        .await?;
    expect(reference, &put, StatusCode::CREATED, &format!("putting manifest {name}"))
}

fn expect(
    reference: &Reference,
    answer: &crate::client::Answer,
    status: StatusCode,
    what: &str,
) -> Result<(), Error> {
    if answer.status == status {
        return Ok(());
    }
    Err(Error::Status {
        registry: reference.registry.clone(),
        status: answer.status.as_u16(),
        what: format!("{what} in {reference}"),
        detail: registry_message(&answer.body),
    })
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    rfc3339(seconds * 1_000)
}

/// `ms` since the Unix epoch as an RFC 3339 UTC time:
/// `YYYY-MM-DDTHH:MM:SSZ`, with `.mmm` before the `Z` when `ms` is not a
/// whole second.
pub fn rfc3339(ms: u64) -> String {
    let (seconds, milli) = (ms / 1_000, ms % 1_000);
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let fraction = if milli == 0 { String::new() } else { format!(".{milli:03}") };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}{fraction}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(super::rfc3339(1_796_395_845_000), "2026-12-04T14:50:45Z");
        assert_eq!(super::rfc3339(1_796_425_338_237), "2026-12-04T23:02:18.237Z");
    }
}
