//! Plugins from an OCI registry.
//!
//! A plugin's `path` may be `oci://registry/name@sha256:…`: the host pulls
//! the component into a content-addressed cache, checks every byte against
//! the digests that name it, and, when the plugin says so, checks a
//! cosign-compatible signature made with a known key. `pulse-host push`
//! publishes a component in the `oci-wasm` layout (config
//! `application/vnd.wasm.config.v0+json`, one `application/wasm` layer)
//! that other OCI tools read too.
//!
//! # Layout
//! - `reference`: `oci://` references, parsed with each rule named.
//! - `client`: the registry's HTTP API and its credential challenges.
//! - `manifest`: the JSON a registry keeps: manifests and descriptors.
//! - `store`: pulls into the cache; a failed pull leaves no file.
//! - `push`: publishes a component.
//! - `signature`: keys, and signatures in cosign's layout (the payload
//!   signed with ECDSA P-256 under the tag `sha256-<hex>.sig`).
#![warn(missing_docs)]

mod client;
mod manifest;
mod push;
mod reference;
mod signature;
mod store;

pub use client::{Client, Credentials};
pub use push::{Interfaces, Pushed, push, rfc3339};
pub use reference::{Reference, SCHEME, is_reference};
pub use signature::{PublicKey, SigningKey, sign};
pub use store::{Pulled, Store};

use std::path::PathBuf;

/// What went wrong with a registry, a digest, a key or the cache; each
/// names the thing concerned and, where one exists, the way out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection, or the answer broke off.
    #[error("cannot reach registry {registry}: {detail}")]
    Unreachable {
        /// The registry (or token service).
        registry: String,
        /// The cause.
        detail: String,
    },
    /// 401 after the credential challenge was answered.
    #[error(
        "registry {registry} refused access (401 Unauthorized{}): {}",
        if detail.is_empty() { String::new() } else { format!(": {detail}") },
        if *credentials { "it refused the credentials in PULSE_REGISTRY_USERNAME and PULSE_REGISTRY_PASSWORD" }
        else { "set PULSE_REGISTRY_USERNAME and PULSE_REGISTRY_PASSWORD to the registry's user name and password or token" }
    )]
    Unauthorized {
        /// The registry.
        registry: String,
        /// The registry's words.
        detail: String,
        /// Whether credentials were sent.
        credentials: bool,
    },
    /// 404.
    #[error("the registry has no {what} (404{})", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    NotFound {
        /// The reference asked for.
        reference: String,
        /// What was missing (a manifest, a blob, a signature).
        what: String,
        /// The registry's words.
        detail: String,
    },
    /// Another status than the one expected.
    #[error("registry {registry} answered {status} to {what}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Status {
        /// The registry.
        registry: String,
        /// The status.
        status: u16,
        /// The request.
        what: String,
        /// The registry's words.
        detail: String,
    },
    /// An answer that breaks the distribution spec.
    #[error("registry {registry}: {detail}")]
    Protocol {
        /// The registry.
        registry: String,
        /// What was wrong.
        detail: String,
    },
    /// Bytes that are not what their digest says.
    #[error("{what} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was checked.
        what: String,
        /// The digest that named it.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// A manifest without exactly one `application/wasm` layer.
    #[error("{detail}")]
    NotAComponent {
        /// The reference.
        reference: String,
        /// What the manifest holds instead.
        detail: String,
    },
    /// No signature, or none the key accepts.
    #[error("{detail}")]
    Signature {
        /// The reference.
        reference: String,
        /// What was found.
        detail: String,
    },
    /// A key file that cannot be used.
    #[error("key {path}: {detail}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong and what is accepted.
        detail: String,
    },
    /// The cache or a file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// What was asked is not allowed (a digest to push to, say).
    #[error("{0}")]
    Usage(String),
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
