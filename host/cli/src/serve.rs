//! What a running host serves: per `[[plugin]]` a node of its pool and the
//! plugin's workers, per `[[schedule]]` a running schedule. Started from
//! the configuration, changed in place by a reload (`reload`), left on the
//! way out.

use std::sync::Arc;

use anyhow::Context;
use pulse_config::{Config, PluginConfig, ScheduleConfig, Source, Upgrade};
use pulse_pool::{Node, NodeOptions, Release, WorkerOptions};
use pulse_runtime::Runtime;

use crate::adapter::{WasmHandler, WasmProducer};
use crate::gate::Record;
use crate::run::{plugin_options, producer_options};

/// A plugin loaded from its file, with the release its workers announce.
pub(crate) struct LoadedPlugin {
    pub(crate) plugin: pulse_runtime::Plugin,
    pub(crate) release: Release,
}

/// A producer loaded from its file, with the file's digest.
pub(crate) struct LoadedProducer {
    pub(crate) producer: pulse_runtime::Producer,
    pub(crate) digest: String,
}

/// One `[[plugin]]` this host serves.
pub(crate) struct Served {
    pub(crate) config: PluginConfig,
    pub(crate) loaded: LoadedPlugin,
    pub(crate) node: Arc<Node>,
    /// Its workers on this host, in the order they joined.
    pub(crate) workers: Vec<ServedWorker>,
    /// The section and release it served before it took a release
    /// announced for the pool (`rollout start`): what `rollout undo`
    /// goes back to. Kept loaded until then.
    pub(crate) previous: Option<(PluginConfig, LoadedPlugin)>,
}

/// One worker of a served plugin: its id, and what its plugin did.
pub(crate) struct ServedWorker {
    pub(crate) id: String,
    pub(crate) record: Arc<Record>,
}

/// One `[[schedule]]` running on this host (it ends when dropped).
pub(crate) struct Scheduled {
    pub(crate) config: ScheduleConfig,
    pub(crate) digest: String,
    /// The node it runs on: a served plugin's, or one of the clients.
    pub(crate) node: Arc<Node>,
    _schedule: pulse_pool::Schedule,
}

/// Everything a host serves.
pub(crate) struct Host<'a> {
    /// The configuration served: plugins and schedules as reloaded last;
    /// the other sections as the host started.
    pub(crate) config: Config,
    pub(crate) client: &'a pulse_redis::Redis,
    pub(crate) options: NodeOptions,
    pub(crate) api: Option<&'a pulse_http::Api>,
    pub(crate) runtime: Runtime,
    pub(crate) served: Vec<Served>,
    /// Client-only nodes of pools this host runs schedules for without
    /// serving them.
    pub(crate) clients: Vec<Arc<Node>>,
    pub(crate) schedules: Vec<Scheduled>,
    /// A signal asked the host to leave during a reload (which stopped
    /// there).
    pub(crate) leave_requested: bool,
}

/// `sha256:<hex>` of `bytes`: a component's digest, as pools record
/// releases.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A plugin's or producer's file, read once (so the digest is that of
/// the code loaded), with its digest.
pub(crate) struct Component {
    bytes: Vec<u8>,
    pub(crate) digest: String,
}

impl Component {
    /// The component `source` names: a file, or a registry's component
    /// pulled into `cache_dir` (config checks it is set for one).
    pub(crate) fn fetch(source: &Source, cache_dir: Option<&std::path::Path>) -> anyhow::Result<Self> {
        match source {
            Source::File(path) => {
                let bytes =
                    std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))?;
                Ok(Self { digest: digest(&bytes), bytes })
            }
            Source::Registry { reference, verify } => {
                let cache_dir = cache_dir.context("a registry path needs [runtime] cache_dir")?;
                let pulled = blocking(|| crate::registry::pull(reference, verify.as_deref(), cache_dir))?;
                Ok(Self { digest: pulled.component_digest, bytes: pulled.bytes })
            }
        }
    }
}

/// Loads, checks and pre-instantiates a plugin from its file. Compiling
/// takes a while: the thread leaves the async runtime's pool meanwhile.
pub(crate) fn load_plugin(
    runtime: &Runtime,
    config: &PluginConfig,
    file: Component,
) -> anyhow::Result<LoadedPlugin> {
    let options = plugin_options(config)?;
    let plugin = blocking(|| runtime.load(&config.name, &file.bytes, options))?;
    Ok(LoadedPlugin { plugin, release: Release { digest: file.digest, version: config.version.clone() } })
}

/// Loads, checks and pre-instantiates a schedule's producer from its file.
pub(crate) fn load_producer(
    runtime: &Runtime,
    config: &ScheduleConfig,
    file: Component,
) -> anyhow::Result<LoadedProducer> {
    let options = producer_options(config)?;
    let producer = blocking(|| runtime.load_producer(&config.name, &file.bytes, options))?;
    Ok(LoadedProducer { producer, digest: file.digest })
}

/// Builds the runtime of `config` and loads every plugin and producer it
/// lists, refusing any that is not a valid job handler or job producer.
pub(crate) fn load_all(config: &Config) -> anyhow::Result<(Runtime, Vec<LoadedPlugin>, Vec<LoadedProducer>)> {
    let runtime =
        Runtime::new(crate::run::runtime_config(config)).context("failed to start the plugin runtime")?;
    let cache_dir = config.runtime.cache_dir.as_deref();
    let plugins = config
        .plugins
        .iter()
        .map(|plugin| load_plugin(&runtime, plugin, Component::fetch(&plugin.source, cache_dir)?))
        .collect::<anyhow::Result<_>>()?;
    let producers = config
        .schedules
        .iter()
        .map(|schedule| load_producer(&runtime, schedule, Component::fetch(&schedule.source, cache_dir)?))
        .collect::<anyhow::Result<_>>()?;
    Ok((runtime, plugins, producers))
}

/// Runs `f` where it may block: outside the async runtime's pool when on a
/// multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// What a pool records as its handler: the plugin's name and digest.
pub(crate) fn identity(config: &PluginConfig, release: &Release) -> String {
    let hex = release.digest.strip_prefix("sha256:").unwrap_or(&release.digest);
    format!("{:?} (sha256 {hex})", config.name)
}

/// Whether this host may serve `config`'s pool with `release`: the pool
/// records one handler; another file of the same plugin is a new release,
/// taken while it rolls through the pool unless `upgrade = "refuse"`.
/// Returns the identity to record in place of the pool's (`None`: nothing
/// to record). Writes nothing but the first claim of a new pool.
pub(crate) async fn check_claim(
    node: &Node,
    config: &PluginConfig,
    release: &Release,
) -> anyhow::Result<Option<String>> {
    if let Some(reason) = node.refused_release(&release.digest).await? {
        anyhow::bail!(
            "pool {:?} refuses release {release} of plugin {:?}: {reason} (after fixing the release, \
             `pulse-host rollout --pool {} --clear {}` lets hosts try it again)",
            config.pool,
            config.name,
            config.pool,
            release.digest
        );
    }
    let identity = identity(config, release);
    let Some(recorded) = node.claim_handler(&identity).await? else {
        return Ok(None);
    };
    let same_plugin = recorded.starts_with(&format!("{:?} (", config.name));
    if same_plugin && config.upgrade == Upgrade::Rolling {
        return Ok(Some(identity));
    }
    let why = if same_plugin {
        "this plugin has `upgrade = \"refuse\"` (set it to \"rolling\" to roll a new release through the pool, \
         or stop the pool's other hosts first)"
    } else {
        "a pool runs one plugin (give this plugin another pool, or stop the pool's other hosts first)"
    };
    anyhow::bail!("pool {:?} is served by plugin {recorded}; this host brings {identity}: {why}", config.pool)
}

/// Records a new release as the pool's handler (see [`check_claim`]).
pub(crate) async fn record_claim(node: &Node, config: &PluginConfig, identity: &str) -> anyhow::Result<()> {
    node.record_handler(identity).await?;
    tracing::info!(pool = %config.pool, plugin = %config.name, handler = identity, "a new release of the plugin rolls through the pool");
    Ok(())
}

pub(crate) fn worker_options(config: &PluginConfig, release: &Release) -> WorkerOptions {
    WorkerOptions {
        max_concurrent_calls: config.max_concurrent_calls,
        release: release.clone(),
        ..WorkerOptions::default()
    }
}

impl<'a> Host<'a> {
    /// Loads every plugin and producer of `config`, joins the plugins'
    /// pools with their workers and starts the schedules. On an error,
    /// what was joined is left again.
    pub(crate) async fn start(
        config: &Config,
        client: &'a pulse_redis::Redis,
        options: &NodeOptions,
        api: Option<&'a pulse_http::Api>,
    ) -> anyhow::Result<Host<'a>> {
        let (runtime, plugins, producers) = load_all(config)?;
        let mut host = Host {
            config: config.clone(),
            client,
            options: options.clone(),
            api,
            runtime,
            served: Vec::new(),
            clients: Vec::new(),
            schedules: Vec::new(),
            leave_requested: false,
        };
        let started = async {
            for (plugin_config, loaded) in config.plugins.iter().zip(plugins) {
                host.add_plugin(plugin_config.clone(), loaded).await?;
            }
            for (schedule, loaded) in config.schedules.iter().zip(producers) {
                host.start_schedule(schedule.clone(), loaded).await?;
            }
            anyhow::Ok(())
        };
        if let Err(error) = started.await {
            // Leave what was joined: no slot may stay behind for a worker
            // that will never read its inbox.
            host.leave().await;
            return Err(error);
        }
        Ok(host)
    }

    /// Joins `config`'s pool, claims it for the plugin and adds the
    /// plugin's workers; the API answers for the pool from then on.
    pub(crate) async fn add_plugin(
        &mut self,
        config: PluginConfig,
        loaded: LoadedPlugin,
    ) -> anyhow::Result<()> {
        let node = Arc::new(
            Node::join(self.client, &config.pool, self.options.clone())
                .await
                .with_context(|| format!("failed to join pool {:?}", config.pool))?,
        );
        tracing::info!(pool = %config.pool, node = node.id(), "joined the pool as node {}", node.id());
        self.served.push(Served { config, loaded, node: node.clone(), workers: Vec::new(), previous: None });
        let served = self.served.last_mut().expect("pushed");
        if let Some(identity) = check_claim(&node, &served.config, &served.loaded.release).await? {
            record_claim(&node, &served.config, &identity).await?;
        }
        for _ in 0..served.config.workers {
            served.add_worker().await?;
        }
        if let Some(api) = self.api {
            api.add_pool(node.clone(), Some(&served.config.name))
                .await
                .with_context(|| format!("failed to serve pool {:?} over HTTP", node.pool()))?;
        }
        Ok(())
    }

    /// Starts `config`'s schedule on the node of its pool: this host's
    /// full node when it serves the pool, otherwise a client-only node.
    pub(crate) async fn start_schedule(
        &mut self,
        config: ScheduleConfig,
        loaded: LoadedProducer,
    ) -> anyhow::Result<()> {
        let served = self.served.iter().map(|s| &s.node).chain(&self.clients);
        let node = match served.into_iter().find(|node| node.pool() == config.pool) {
            Some(node) => node.clone(),
            None => {
                let node = Arc::new(
                    Node::client(self.client, &config.pool, self.options.clone())
                        .await
                        .with_context(|| format!("failed to reach pool {:?}", config.pool))?,
                );
                self.clients.push(node.clone());
                if let Some(api) = self.api {
                    api.add_pool(node.clone(), None)
                        .await
                        .with_context(|| format!("failed to serve pool {:?} over HTTP", node.pool()))?;
                }
                node
            }
        };
        let schedule = node
            .schedule(&config.name, config.interval, WasmProducer::new(&loaded.producer))
            .await
            .with_context(|| {
                format!("failed to start schedule {:?} of pool {:?}", config.name, config.pool)
            })?;
        tracing::info!(pool = %config.pool, schedule = %config.name, interval = ?config.interval, "schedule started");
        self.schedules.push(Scheduled { config, digest: loaded.digest, node, _schedule: schedule });
        Ok(())
    }

    /// Waits until every pool this host serves was shut down; forever
    /// when it serves none.
    pub(crate) async fn all_shut_down(&self) {
        if self.served.is_empty() {
            std::future::pending::<()>().await;
        }
        futures_util::future::join_all(self.served.iter().map(|served| served.node.pool_shut_down())).await;
    }

    /// Ends the schedules here (the other hosts running them go on), then
    /// every worker leaves: its jobs move to the other hosts, or wait.
    pub(crate) async fn leave(&mut self) {
        self.schedules.clear();
        for node in self.clients.drain(..) {
            node.close().await;
        }
        for served in &self.served {
            served.node.close().await;
        }
    }
}

impl Served {
    /// Replaces worker `at` of the plugin by one running `plugin` as
    /// `options` say, its handler counting in `record`
    /// ([`Node::replace_worker`]: the old worker's jobs move to it);
    /// returns the record of the worker replaced.
    pub(crate) async fn replace_worker(
        &mut self,
        at: usize,
        plugin: &pulse_runtime::Plugin,
        options: &WorkerOptions,
        record: Arc<Record>,
    ) -> anyhow::Result<Arc<Record>> {
        let handler = WasmHandler::new(plugin, &options.release, record.clone());
        let heir = self.node.replace_worker(&self.workers[at].id, handler, options.clone()).await?;
        let old = std::mem::replace(&mut self.workers[at], ServedWorker { id: heir, record });
        tracing::info!(pool = %self.config.pool, worker = %self.workers[at].id, replaced = %old.id, release = %options.release, "worker replaced");
        Ok(old.record)
    }

    /// Adds a worker of the plugin as loaded now.
    pub(crate) async fn add_worker(&mut self) -> anyhow::Result<()> {
        let options = worker_options(&self.config, &self.loaded.release);
        let record = Arc::new(Record::default());
        let handler = WasmHandler::new(&self.loaded.plugin, &self.loaded.release, record.clone());
        let id = self.node.add_worker_with(handler, options).await?;
        tracing::info!(pool = %self.config.pool, plugin = %self.config.name, worker = %id, release = %self.loaded.release, "worker added");
        self.workers.push(ServedWorker { id, record });
        Ok(())
    }
}
