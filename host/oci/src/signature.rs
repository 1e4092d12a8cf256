//! Signatures in cosign's layout, so that `cosign sign --key` and
//! `cosign verify --key` work with the same keys and registries:
//!
//! - the signed payload is cosign's "simple signing" JSON naming the
//!   manifest's digest;
//! - the signature is ECDSA P-256 over SHA-256 of the payload, DER,
//!   base64, in the layer's `dev.cosignproject.cosign/signature`
//!   annotation;
//! - the signature manifest sits under the tag `sha256-<hex>.sig` of the
//!   same repository; each signature is one more layer.
//!
//! Keys are PEM: a public key (`PUBLIC KEY`, what `cosign
//! generate-key-pair` writes to `cosign.pub`), a private key as PKCS#8
//! (`PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use bytes::Bytes;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::{
    DecodePrivateKey as _, DecodePublicKey as _, EncodePrivateKey as _, EncodePublicKey as _, LineEnding,
};

use crate::manifest::{Descriptor, Manifest};
use crate::store::check_status;
use crate::{Client, Error, Reference, digest};

/// The media type of a signed payload.
const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation holding a payload's signature.
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `type` of cosign's payload.
const PAYLOAD_KIND: &str = "cosign container image signature";

/// A key signatures are checked with.
#[derive(Debug, Clone)]
pub struct PublicKey {
    key: VerifyingKey,
    path: PathBuf,
    fingerprint: String,
}

impl PublicKey {
    /// Reads a PEM public key (ECDSA P-256).
    pub fn read(path: &Path) -> Result<Self, Error> {
        let text = read_text(path)?;
        let key = p256::PublicKey::from_public_key_pem(text.trim()).map_err(|error| Error::Key {
            path: path.to_owned(),
            detail: format!(
                "not an ECDSA P-256 public key in PEM (\"-----BEGIN PUBLIC KEY-----\", as cosign.pub): {error}"
            ),
        })?;
        Ok(Self::new(VerifyingKey::from(&key), path))
    }

    fn new(key: VerifyingKey, path: &Path) -> Self {
        let der = key.to_public_key_der().expect("a P-256 key encodes");
        let fingerprint = digest(der.as_bytes())["sha256:".len()..][..16].to_owned();
        Self { key, path: path.to_owned(), fingerprint }
    }

    /// The first 16 hex digits of the SHA-256 of the key (DER): how the
    /// cache remembers what this key verified.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The file the key was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A key signatures are made with.
#[derive(Clone)]
pub struct SigningKey {
    key: p256::ecdsa::SigningKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Reads a PEM private key (ECDSA P-256, PKCS#8 or SEC1).
    pub fn read(path: &Path) -> Result<Self, Error> {
        let text = read_text(path)?;
        let text = text.trim();
        if text.contains("ENCRYPTED SIGSTORE PRIVATE KEY") || text.contains("ENCRYPTED COSIGN PRIVATE KEY") {
            return Err(Error::Key {
                path: path.to_owned(),
                detail:
                    "cosign's encrypted key format is not read here: sign with `cosign sign --key` instead \
                         (its signatures verify the same), or make a PEM key with `pulse-host keygen`"
                        .into(),
            });
        }
        let key = p256::SecretKey::from_pkcs8_pem(text)
            .or_else(|_| p256::SecretKey::from_sec1_pem(text))
            .map_err(|_| Error::Key {
                path: path.to_owned(),
                detail: "not an ECDSA P-256 private key in PEM (\"-----BEGIN PRIVATE KEY-----\" or \
                         \"-----BEGIN EC PRIVATE KEY-----\")"
                    .into(),
            })?;
        Ok(Self { key: key.into() })
    }

    /// A new key from the system's random source.
    pub fn generate() -> Result<Self, Error> {
        let path = Path::new("/dev/urandom");
        let io = |source| Error::Io { path: path.to_owned(), source };
        let mut file = std::fs::File::open(path).map_err(io)?;
        loop {
            let mut bytes = [0u8; 32];
            file.read_exact(&mut bytes).map_err(io)?;
            // Almost every 32 bytes is a valid scalar; the rest are drawn again.
            if let Ok(key) = p256::ecdsa::SigningKey::from_slice(&bytes) {
                return Ok(Self { key });
            }
        }
    }

    /// The private key as PKCS#8 PEM.
    pub fn private_pem(&self) -> String {
        self.key.to_pkcs8_pem(LineEnding::LF).expect("a P-256 key encodes").to_string()
    }

    /// The public key as PEM (`PUBLIC KEY`), for `verify = { key = … }`.
    pub fn public_pem(&self) -> String {
        self.key.verifying_key().to_public_key_pem(LineEnding::LF).expect("a P-256 key encodes")
    }
}

/// Signs the manifest `reference` names (a tag is resolved to its digest
/// first) and adds the signature to its `.sig` tag. Returns the
/// reference signed, pinned to its digest.
pub async fn sign(client: &Client, reference: &Reference, key: &SigningKey) -> Result<Reference, Error> {
    let answer = client.manifest(reference, reference.manifest_reference()).await?;
    check_status(reference, &answer, "manifest", "such manifest")?;
    let manifest_digest = digest(&answer.body);
    if let Some(expected) = &reference.digest
        && expected != &manifest_digest
    {
        return Err(Error::DigestMismatch {
            what: format!("the manifest of {reference}"),
            expected: expected.clone(),
            actual: manifest_digest,
        });
    }
    let pinned = reference.at(&manifest_digest);
    let payload = payload(&pinned);
    let signature: Signature = key.key.sign(&payload);
    let encoded = base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes());

    let tag = signature_tag(&manifest_digest);
    let existing = client.manifest(&pinned, &tag).await?;
    let mut layers = match existing.status {
        http::StatusCode::NOT_FOUND => Vec::new(),
        _ => {
            check_status(&pinned, &existing, "signature manifest", "signature manifest")?;
            let manifest: Manifest =
                serde_json::from_slice(&existing.body).map_err(|error| Error::Protocol {
                    registry: pinned.registry.clone(),
                    detail: format!("its signature manifest {tag} is not an image manifest: {error}"),
                })?;
            manifest.layers
        }
    };
    let mut layer = Descriptor::of(PAYLOAD_TYPE, &payload);
    layer.annotations.insert(SIGNATURE_ANNOTATION.to_owned(), encoded);
    if !layers.iter().any(|l| l.digest == layer.digest && l.annotations == layer.annotations) {
        layers.push(layer);
    }
    crate::push::upload_blob(client, &pinned, Bytes::from(payload)).await?;
    // cosign's config: an image config listing the payloads as layers.
    let diff_ids: Vec<_> = layers.iter().map(|l| l.digest.clone()).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "", "os": "", "config": {},
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .expect("JSON serialises");
    crate::push::upload_blob(client, &pinned, Bytes::from(config.clone())).await?;
    let manifest = Manifest::new(Descriptor::of("application/vnd.oci.image.config.v1+json", &config), layers);
    crate::push::put_manifest(client, &pinned, &tag, manifest.to_bytes()).await?;
    Ok(pinned)
}

/// Whether a signature under `reference`'s `.sig` tag was made by `key`
/// over this manifest's digest.
pub(crate) async fn verify(client: &Client, reference: &Reference, key: &PublicKey) -> Result<(), Error> {
    let manifest_digest = reference.digest.as_deref().expect("verify takes a pinned reference");
    let tag = signature_tag(manifest_digest);
    let refuse = |detail: String| Error::Signature { reference: reference.to_string(), detail };
    let answer = client.manifest(reference, &tag).await?;
    if answer.status == http::StatusCode::NOT_FOUND {
        return Err(refuse(format!(
            "it is not signed (no {tag} in the registry), and the plugin's `verify` asks for a signature by {}: \
             sign it with `pulse-host sign --key KEY {reference}` or cosign",
            key.path().display()
        )));
    }
    check_status(reference, &answer, "signature manifest", "signature manifest")?;
    let manifest: Manifest = serde_json::from_slice(&answer.body).map_err(|error| Error::Protocol {
        registry: reference.registry.clone(),
        detail: format!("its signature manifest {tag} is not an image manifest: {error}"),
    })?;
    let mut checked = 0;
    for layer in manifest.layers.iter().filter(|l| l.media_type == PAYLOAD_TYPE) {
        let Some(encoded) = layer.annotations.get(SIGNATURE_ANNOTATION) else { continue };
        checked += 1;
        let Ok(signature) = base64::engine::general_purpose::STANDARD.decode(encoded) else { continue };
        let Ok(signature) = Signature::from_der(&signature).or_else(|_| Signature::from_slice(&signature))
        else {
            continue;
        };
        if crate::reference::check_digest(&layer.digest).is_err() {
            continue;
        }
        let answer = client.blob(reference, &layer.digest).await?;
        check_status(reference, &answer, "signature payload", "signature payload")?;
        if digest(&answer.body) != layer.digest || key.key.verify(&answer.body, &signature).is_err() {
            continue;
        }
        if signs(&answer.body, manifest_digest) {
            return Ok(());
        }
    }
    Err(refuse(format!(
        "none of its {checked} signature(s) is by the key in {} over this manifest: it was signed with another key, \
         or the signature is for other content",
        key.path().display()
    )))
}

/// Whether a payload names `manifest_digest` as cosign's does.
fn signs(payload: &[u8], manifest_digest: &str) -> bool {
    let Ok(payload) = serde_json::from_slice::<serde_json::Value>(payload) else { return false };
    let critical = &payload["critical"];
    critical["type"] == PAYLOAD_KIND && critical["image"]["docker-manifest-digest"] == manifest_digest
}

/// cosign's payload for `reference` (pinned).
fn payload(reference: &Reference) -> Vec<u8> {
    let identity = format!("{}/{}", reference.registry, reference.repository);
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": { "docker-reference": identity },
            "image": { "docker-manifest-digest": reference.digest },
            "type": PAYLOAD_KIND,
        },
        "optional": null,
    }))
    .expect("JSON serialises")
}

/// `sha256-<hex>.sig`.
fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

fn read_text(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_with_its_key_only_and_over_its_digest_only() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (SigningKey::generate().unwrap(), SigningKey::generate().unwrap());
        std::fs::write(dir.path().join("a.key"), a.private_pem()).unwrap();
        std::fs::write(dir.path().join("a.pub"), a.public_pem()).unwrap();
        let a = SigningKey::read(&dir.path().join("a.key")).unwrap();
        let public = PublicKey::read(&dir.path().join("a.pub")).unwrap();
        let reference =
            Reference::parse(&format!("oci://localhost:5000/echo@{}", digest(b"manifest"))).unwrap();
        let payload = payload(&reference);
        let signature: Signature = a.key.sign(&payload);
        assert!(public.key.verify(&payload, &signature).is_ok());
        assert!(signs(&payload, &digest(b"manifest")));
        assert!(!signs(&payload, &digest(b"another")));
        let other: Signature = b.key.sign(&payload);
        assert!(public.key.verify(&payload, &other).is_err());
        assert_eq!(
            signature_tag(&digest(b"manifest")),
            format!("{}.sig", digest(b"manifest").replace(':', "-"))
        );
    }

    #[test]
    fn a_key_of_another_kind_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cosign.key");
        std::fs::write(&path, "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nabc\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n").unwrap();
        assert!(SigningKey::read(&path).unwrap_err().to_string().contains("cosign sign --key"));
        std::fs::write(&path, "not a key").unwrap();
        assert!(PublicKey::read(&path).unwrap_err().to_string().contains("not an ECDSA P-256 public key"));
    }
}
