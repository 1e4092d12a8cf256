//! Pulls into a content-addressed cache: `<cache>/oci/blobs/sha256/<hex>`
//! holds manifests and components alike, each checked against its name
//! whenever it is read. Nothing is written until the manifest, the
//! component and (when asked) the signature have all been checked, so a
//! failed pull leaves no file behind.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::client::registry_message;
use crate::manifest::Manifest;
use crate::signature::{self, PublicKey};
use crate::{Client, Error, Reference, digest};

/// A cache of pulled components.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    client: Client,
}

/// A component pulled (or found in the cache) and checked.
#[derive(Debug)]
pub struct Pulled {
    /// The component's bytes.
    pub bytes: Vec<u8>,
    /// The reference, pinned to its manifest's digest.
    pub reference: Reference,
    /// The component's own digest (its layer's): what pools record as the
    /// release, the same as for the file it was pushed from.
    pub component_digest: String,
    /// Whether nothing had to be fetched.
    pub from_cache: bool,
}

impl Store {
    /// A cache under `cache_dir/oci`.
    pub fn new(cache_dir: &Path, client: Client) -> Self {
        Self { dir: cache_dir.join("oci"), client }
    }

    /// The component `reference` names, checked against its digests and,
    /// with `key`, against a signature the key accepts. A reference by
    /// digest already in the cache (and verified with `key`) needs no
    /// registry; a tag is always asked of the registry.
    pub async fn pull(&self, reference: &Reference, key: Option<&PublicKey>) -> Result<Pulled, Error> {
        let mut fetched: Vec<(String, Vec<u8>)> = Vec::new();
        let (manifest_digest, manifest_bytes) = match reference.digest.as_deref().and_then(|d| self.cached(d))
        {
            Some(bytes) => (reference.digest.clone().expect("cached by its digest"), bytes),
            None => {
                let (digest, bytes) = self.fetch_manifest(reference).await?;
                fetched.push((digest.clone(), bytes.clone()));
                (digest, bytes)
            }
        };
        let pinned = reference.at(&manifest_digest);
        let manifest: Manifest =
            serde_json::from_slice(&manifest_bytes).map_err(|error| Error::Protocol {
                registry: reference.registry.clone(),
                detail: format!("the manifest of {pinned} is not an image manifest: {error}"),
            })?;
        let layer = manifest
            .component_layer()
            .map_err(|detail| Error::NotAComponent { reference: pinned.to_string(), detail })?
            .clone();
        crate::reference::check_digest(&layer.digest).map_err(|why| Error::Protocol {
            registry: reference.registry.clone(),
            detail: format!("the manifest of {pinned} names its component by a {why}"),
        })?;
        let bytes = match self.cached(&layer.digest) {
            Some(bytes) => bytes,
            None => {
                let bytes = self.fetch_blob(&pinned, &layer.digest, "component").await?;
                if bytes.len() as u64 != layer.size {
                    return Err(Error::Protocol {
                        registry: reference.registry.clone(),
                        detail: format!(
                            "the component of {pinned} is {} bytes, its manifest says {}",
                            bytes.len(),
                            layer.size
                        ),
                    });
                }
                fetched.push((layer.digest.clone(), bytes.clone()));
                bytes
            }
        };
        let mut marker = None;
        if let Some(key) = key {
            let path =
                self.dir.join("verified").join(format!("{}-{}", hex(&manifest_digest), key.fingerprint()));
            if !path.is_file() {
                signature::verify(&self.client, &pinned, key).await?;
                marker = Some(path);
            }
        }
        let from_cache = fetched.is_empty() && marker.is_none();
        // The component before its manifest: a manifest in the cache
        // always finds its component there.
        fetched.reverse();
        for (digest, bytes) in &fetched {
            self.write(&self.blob_path(digest), bytes)?;
        }
        if let Some(path) = marker {
            self.write(&path, b"")?;
        }
        Ok(Pulled { bytes, reference: pinned, component_digest: layer.digest, from_cache })
    }

    async fn fetch_manifest(&self, reference: &Reference) -> Result<(String, Vec<u8>), Error> {
        let name = reference.manifest_reference();
        let answer = self.client.manifest(reference, name).await?;
        check_status(reference, &answer, "manifest", "such manifest")?;
        let actual = digest(&answer.body);
        if let Some(expected) = &reference.digest
            && &actual != expected
        {
            return Err(Error::DigestMismatch {
                what: format!("the manifest of {reference}"),
                expected: expected.clone(),
                actual,
            });
        }
        Ok((actual, answer.body.to_vec()))
    }

    async fn fetch_blob(&self, reference: &Reference, blob: &str, what: &str) -> Result<Vec<u8>, Error> {
        let answer = self.client.blob(reference, blob).await?;
        check_status(reference, &answer, &format!("{what} blob {blob}"), &format!("{what} blob {blob}"))?;
        let actual = digest(&answer.body);
        if actual != blob {
            return Err(Error::DigestMismatch {
                what: format!("the {what} of {reference}"),
                expected: blob.to_owned(),
                actual,
            });
        }
        Ok(answer.body.to_vec())
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs").join("sha256").join(hex(digest))
    }

    /// The cached bytes named `digest`, if present and intact; a damaged
    /// file is removed (and fetched again).
    fn cached(&self, digest: &str) -> Option<Vec<u8>> {
        let path = self.blob_path(digest);
        let bytes = std::fs::read(&path).ok()?;
        if crate::digest(&bytes) == digest {
            return Some(bytes);
        }
        tracing::warn!(path = %path.display(), digest, "a cached file does not match its digest; it is removed and fetched again");
        let _ = std::fs::remove_file(&path);
        None
    }

    /// Writes `bytes` at `path` whole or not at all (a temporary file
    /// renamed into place).
    fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), Error> {
        let io = |path: &Path, source| Error::Io { path: path.to_owned(), source };
        let dir = path.parent().expect("cache paths have a folder");
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| io(dir, e))?;
        file.write_all(bytes).and_then(|()| file.as_file().sync_all()).map_err(|e| io(path, e))?;
        file.persist(path).map_err(|error| Error::Io { path: path.to_owned(), source: error.error })?;
        Ok(())
    }
}

/// Turns 404 and any other failure into the error that says so.
pub(crate) fn check_status(
    reference: &Reference,
    answer: &crate::client::Answer,
    what: &str,
    missing: &str,
) -> Result<(), Error> {
    if answer.status.is_success() {
        return Ok(());
    }
    let detail = registry_message(&answer.body);
    if answer.status == http::StatusCode::NOT_FOUND {
        return Err(Error::NotFound { reference: reference.to_string(), what: missing.to_owned(), detail });
    }
    Err(Error::Status {
        registry: reference.registry.clone(),
        status: answer.status.as_u16(),
        what: format!("{what} of {reference}"),
        detail,
    })
}

fn hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}
