//! Components in OCI registries: pulled for a plugin's `oci://` path,
//! and the `push`, `sign` and `keygen` commands.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use pulse_oci::{Client, Credentials, PublicKey, Pulled, Reference, SigningKey, Store};

/// The component `reference` names, from `cache_dir` or the registry,
/// checked against its digests and, with `verify`, against a signature
/// by that key. Blocks the calling thread (the pull runs on a thread and
/// runtime of its own, so it works from any context, as reading a file
/// does).
pub(crate) fn pull(reference: &Reference, verify: Option<&Path>, cache_dir: &Path) -> anyhow::Result<Pulled> {
    let key = verify.map(PublicKey::read).transpose()?;
    let store = Store::new(cache_dir, Client::new(Credentials::from_env()));
    let pulled = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                anyhow::Ok(runtime.block_on(store.pull(reference, key.as_ref()))?)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the pull of {reference} panicked"))?
    })
    .with_context(|| format!("failed to pull {reference}"))?;
    if !pulled.from_cache {
        tracing::info!(reference = %pulled.reference, component = %pulled.component_digest, verified_with = ?verify, "pulled");
    }
    Ok(pulled)
}

/// What `rollout start --file FILE` announces: the release's digest and
/// where hosts find it. A file is named by its absolute path; a registry
/// reference is pulled (into `runtime.cache_dir`, checked with the pool's
/// plugin's `verify` key when it has one) and named pinned to its digest.
pub fn release_to_announce(
    file: &Path,
    config: &pulse_config::Config,
    pool: &str,
) -> anyhow::Result<(String, String)> {
    let text = file.to_str().context("the file's path is not UTF-8")?;
    if !pulse_oci::is_reference(text) {
        let path =
            std::fs::canonicalize(file).with_context(|| format!("failed to read {}", file.display()))?;
        let bytes = std::fs::read(&path).with_context(|| format!("failed to read {}", path.display()))?;
        let path = path.to_str().context("the file's path is not UTF-8")?.to_owned();
        return Ok((crate::serve::digest(&bytes), path));
    }
    let reference = Reference::parse(text).map_err(anyhow::Error::msg)?;
    let cache_dir = config
        .runtime
        .cache_dir
        .as_deref()
        .context("announcing a registry reference pulls it: set [runtime] cache_dir in the config")?;
    let verify =
        config.plugins.iter().find(|plugin| plugin.pool == pool).and_then(|plugin| match &plugin.source {
            pulse_config::Source::Registry { verify, .. } => verify.clone(),
            pulse_config::Source::File(_) => None,
        });
    let pulled = pull(&reference, verify.as_deref(), cache_dir)?;
    Ok((pulled.component_digest, pulled.reference.untagged().to_string()))
}

/// `push FILE oci://REGISTRY/NAME[:TAG]`: prints the reference pinned to
/// its digest.
pub async fn push(file: &Path, reference: &str, version: Option<&str>) -> anyhow::Result<String> {
    let reference = parse_unpinned(reference)?;
    let bytes = std::fs::read(file).with_context(|| format!("failed to read {}", file.display()))?;
    let mut annotations = BTreeMap::new();
    if let Some(version) = version {
        annotations.insert("org.opencontainers.image.version".to_owned(), version.to_owned());
    }
    let client = Client::new(Credentials::from_env());
    let pushed = pulse_oci::push(&client, &reference, &bytes, annotations)
        .await
        .with_context(|| format!("failed to push {} to {reference}", file.display()))?;
    Ok(format!(
        "pushed {} as {} (component {}); a plugin's path may name it:\n  path = \"{}\"",
        file.display(),
        pushed.reference,
        pushed.component_digest,
        pushed.reference.untagged()
    ))
}

/// `sign REFERENCE --key KEY`.
pub async fn sign(reference: &str, key: &Path) -> anyhow::Result<String> {
    let reference = Reference::parse(reference).map_err(anyhow::Error::msg)?;
    let key = SigningKey::read(key)?;
    let client = Client::new(Credentials::from_env());
    let signed = pulse_oci::sign(&client, &reference, &key)
        .await
        .with_context(|| format!("failed to sign {reference}"))?;
    Ok(format!("signed {signed}"))
}

/// `keygen NAME`: NAME.key (PKCS#8 PEM, readable by its owner only) and
/// NAME.pub. Refuses to overwrite either.
pub fn keygen(name: &Path) -> anyhow::Result<String> {
    let private = name.with_extension("key");
    let public = name.with_extension("pub");
    for path in [&private, &public] {
        anyhow::ensure!(!path.exists(), "{} exists already; keygen does not overwrite keys", path.display());
    }
    let key = SigningKey::generate()?;
    write_new(&private, key.private_pem().as_bytes(), 0o600)?;
    write_new(&public, key.public_pem().as_bytes(), 0o644)?;
    Ok(format!(
        "wrote {} (keep it secret) and {} (for a plugin's verify = {{ key = \"…\" }})",
        private.display(),
        public.display()
    ))
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("failed to create {}", path.display()))?;
    file.write_all(bytes).with_context(|| format!("failed to write {}", path.display()))
}

/// A push's destination: a repository and optionally a tag.
fn parse_unpinned(text: &str) -> anyhow::Result<Reference> {
    // A bare repository parses once given a tag; none is pushed then.
    match Reference::parse(text) {
        Ok(reference) => Ok(reference),
        Err(_) if !text.contains('@') && Reference::parse(&format!("{text}:latest")).is_ok() => {
            let mut reference = Reference::parse(&format!("{text}:latest")).map_err(anyhow::Error::msg)?;
            reference.tag = None;
            Ok(reference)
        }
        Err(why) => anyhow::bail!(why),
    }
}
