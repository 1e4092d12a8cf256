//! Reloading config.toml in a running host (SIGHUP).
//!
//! First everything new is read and checked, with nothing changed yet: the
//! file (its problems with their lines), every plugin and producer whose
//! file or section changed (loaded and checked against its world), and
//! each new release's claim on its pool. Anything wrong refuses the whole
//! reload and the host goes on serving what it served.
//!
//! Then, per `[[plugin]]` (matched by pool):
//! - a new file or a changed section: each worker of the plugin is
//!   replaced by one running the new load, one at a time
//!   ([`pulse_pool::Node::replace_worker`]): the old worker's jobs move
//!   once, to its heir, with their saved state, and no other job moves.
//!   Each heir is judged by the upgrade gate (`gate`) before the next
//!   worker is replaced; a release that fails it is undone (the heirs are
//!   replaced back by the release they replaced, which keeps its loaded
//!   component until then) and the pool records it as refused;
//! - only `workers` changed: workers are added or leave;
//! - a plugin gone from the file: its workers leave (their jobs move to
//!   the pool's other hosts, or wait); a new one: its pool is joined.
//!
//! Schedules that changed, or ran on the node of a plugin gone from the
//! file, start again; client-only nodes no schedule uses any more close;
//! the HTTP token takes effect at
//! once. `[redis]`, `[node]`, `[runtime]` and the rest of `[http]` take
//! effect at the next start: a reload says so and keeps them.

use std::fmt;
use std::sync::Arc;

use pulse_config::{Config, PluginConfig};
use pulse_pool::Node;

use crate::gate::{Gate, Record, Verdict};
use crate::run::Signals;
use crate::serve::{
    Component, Host, LoadedPlugin, LoadedProducer, Served, check_claim, load_plugin, load_producer,
};

/// What a reload changed.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    /// Plugins whose workers were replaced by a new load.
    upgraded: Vec<String>,
    /// Plugins whose new release failed its gate and was undone.
    undone: Vec<String>,
    /// Plugins whose number of workers changed.
    resized: Vec<String>,
    added: Vec<String>,
    removed: Vec<String>,
    /// Schedules started again, started or ended.
    schedules: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            ("upgraded", &self.upgraded),
            ("undone (the new release failed its upgrade gate)", &self.undone),
            ("resized", &self.resized),
            ("added", &self.added),
            ("removed", &self.removed),
        ];
        let mut said = false;
        for (what, plugins) in parts.iter().filter(|(_, plugins)| !plugins.is_empty()) {
            write!(f, "{}{what} {}", if said { "; " } else { "" }, plugins.join(", "))?;
            said = true;
        }
        if self.schedules > 0 {
            write!(
                f,
                "{}{} schedule(s) restarted, started or ended",
                if said { "; " } else { "" },
                self.schedules
            )?;
            said = true;
        }
        if !said {
            f.write_str("no plugin or schedule changed")?;
        }
        Ok(())
    }
}

/// Why a reload did not do all it was asked.
#[derive(Debug)]
pub(crate) enum ReloadError {
    /// Refused while checking: nothing was changed.
    Refused(anyhow::Error),
    /// Failed part way (Redis): what changed before stays changed.
    Failed(anyhow::Error),
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadError::Refused(error) => {
                write!(f, "reload refused, still serving the configuration loaded before: {error:#}")
            }
            ReloadError::Failed(error) => write!(
                f,
                "reload failed part way; what it changed before stays changed (`pulse-host workers` shows what runs): {error:#}"
            ),
        }
    }
}

/// How a plugin's upgrade ended.
pub(crate) enum Upgraded {
    /// Every worker runs the new release.
    Done,
    /// The new release failed its gate and was undone.
    Undone,
    /// The host was asked to leave meanwhile.
    Interrupted,
}

/// What to do with one `[[plugin]]` of the new file (the served plugin it
/// changes is the one of its pool).
enum Change {
    /// Keep the plugin as loaded (maybe with another number of workers).
    Keep(PluginConfig),
    /// Replace its workers by `loaded`'s; record the identity when the
    /// pool must learn of the new release.
    Upgrade(PluginConfig, LoadedPlugin, Option<String>),
    /// Join a pool this host did not serve.
    Add(PluginConfig, LoadedPlugin),
}

impl Host<'_> {
    /// Reloads the configuration file (see the module's documentation).
    ///
    /// # Errors
    /// What refused the reload: nothing was changed then. A failure while
    /// changing workers (Redis) stops the reload where it was.
    pub(crate) async fn reload(&mut self, signals: &mut Signals) -> Result<Summary, ReloadError> {
        let (new, changes, producers, token) = self.prepare().await.map_err(ReloadError::Refused)?;
        self.apply(new, changes, producers, token, signals).await.map_err(ReloadError::Failed)
    }

    /// Reads and checks everything a reload needs, changing nothing.
    #[allow(clippy::type_complexity, reason = "one private step of `reload`")]
    async fn prepare(
        &self,
    ) -> anyhow::Result<(
        Config,
        Vec<Change>,
        Vec<Option<LoadedProducer>>,
        Option<Option<pulse_config::Secret>>,
    )> {
        let new = crate::defaults::load_config(&self.config.path)?;
        self.warn_of_restart_only(&new);
        // Check and load everything first: nothing changes unless all of
        // it is right.
        let mut changes = Vec::new();
        for config in &new.plugins {
            let file = Component::fetch(&config.source, new.runtime.cache_dir.as_deref())?;
            let change = match self.served.iter().find(|served| served.config.pool == config.pool) {
                Some(served) if served.previous.is_some() && file.digest != served.loaded.release.digest => {
                    // It runs a release announced for the pool: the file
                    // of config.toml is not taken over it.
                    tracing::warn!(pool = %config.pool, runs = %served.loaded.release, file = %config.source, "this host runs the release announced for the pool (`pulse-host rollout`); config.toml's file differs and is not taken: point `path` at the announced file, or undo the rollout");
                    let kept = PluginConfig {
                        source: served.config.source.clone(),
                        version: served.config.version.clone(),
                        ..config.clone()
                    };
                    Change::Keep(kept)
                }
                Some(served) => {
                    let same_section = PluginConfig { workers: served.config.workers, ..config.clone() };
                    if same_section == served.config && file.digest == served.loaded.release.digest {
                        Change::Keep(config.clone())
                    } else {
                        let loaded = load_plugin(&self.runtime, config, file)?;
                        let record = check_claim(&served.node, config, &loaded.release).await?;
                        Change::Upgrade(config.clone(), loaded, record)
                    }
                }
                None => Change::Add(config.clone(), load_plugin(&self.runtime, config, file)?),
            };
            changes.push(change);
        }
        // A schedule goes on when its section, its file and its node stay:
        // the node of a plugin gone from the file closes.
        let closing = |node: &Arc<Node>| {
            self.served.iter().any(|served| {
                Arc::ptr_eq(&served.node, node) && !new.plugins.iter().any(|c| c.pool == served.config.pool)
            })
        };
        let mut producers: Vec<Option<LoadedProducer>> = Vec::new();
        for config in &new.schedules {
            let file = Component::fetch(&config.source, new.runtime.cache_dir.as_deref())?;
            let unchanged = self.schedules.iter().any(|running| {
                running.config == *config && running.digest == file.digest && !closing(&running.node)
            });
            producers.push(if unchanged { None } else { Some(load_producer(&self.runtime, config, file)?) });
        }
        let token = match &new.http {
            Some(http) => Some(crate::run::http_token(http)?),
            None => None,
        };
        Ok((new, changes, producers, token))
    }

    /// Makes the changes `prepare` checked.
    async fn apply(
        &mut self,
        new: Config,
        changes: Vec<Change>,
        producers: Vec<Option<LoadedProducer>>,
        token: Option<Option<pulse_config::Secret>>,
        signals: &mut Signals,
    ) -> anyhow::Result<Summary> {
        let mut summary = Summary::default();
        // Schedules that end, change or lose their node stop first.
        let before = self.schedules.len();
        self.schedules.retain(|running| {
            new.schedules.iter().zip(&producers).any(|(config, producer)| {
                producer.is_none() && config.name == running.config.name && config.pool == running.config.pool
            })
        });
        summary.schedules += before - self.schedules.len();
        // Plugins gone from the file: their workers leave.
        let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.served)
            .into_iter()
            .partition(|served| new.plugins.iter().any(|config| config.pool == served.config.pool));
        self.served = kept;
        for served in gone {
            served.node.close().await;
            if let Some(api) = self.api {
                api.remove_pool(&served.config.pool);
            }
            tracing::info!(pool = %served.config.pool, plugin = %served.config.name, "plugin removed: its workers left");
            summary.removed.push(served.config.name);
        }
        for change in changes {
            match change {
                Change::Keep(config) => {
                    let name = config.name.clone();
                    if self.resize(config).await? {
                        summary.resized.push(name);
                    }
                }
                Change::Upgrade(config, loaded, record) => {
                    let name = config.name.clone();
                    match self.upgrade(config, loaded, record, signals, false).await? {
                        Upgraded::Done => summary.upgraded.push(name),
                        Upgraded::Undone => summary.undone.push(name),
                        Upgraded::Interrupted => {
                            self.leave_requested = true;
                            return Ok(summary);
                        }
                    }
                }
                Change::Add(config, loaded) => {
                    summary.added.push(config.name.clone());
                    self.add_plugin(config, loaded).await?;
                }
            }
        }
        for (config, producer) in new.schedules.iter().zip(producers) {
            if let Some(loaded) = producer {
                self.start_schedule(config.clone(), loaded).await?;
                summary.schedules += 1;
            }
        }
        self.close_unused_clients().await;
        if let (Some(api), Some(token)) = (self.api, token) {
            api.set_token(token.map(|token| token.expose().to_owned()));
        }
        self.config.plugins = new.plugins;
        self.config.schedules = new.schedules;
        if let (Some(running), Some(http)) = (&mut self.config.http, new.http) {
            running.token = http.token;
        }
        Ok(summary)
    }

    /// The served plugin of `pool`, which a change of the reload names.
    pub(crate) fn served_mut(&mut self, pool: &str) -> &mut Served {
        self.served.iter_mut().find(|served| served.config.pool == pool).expect("a kept plugin is served")
    }

    /// Replaces each worker of `config`'s plugin, one at a time, by one
    /// running `loaded`, each judged by the upgrade gate before the next
    /// is replaced; then adds or removes workers to `config`'s number. A
    /// release that fails its gate is undone (see `undo`). The list of
    /// workers stays true if a replacement fails.
    pub(crate) async fn upgrade(
        &mut self,
        config: PluginConfig,
        loaded: LoadedPlugin,
        claim: Option<String>,
        signals: &mut Signals,
        keep_previous: bool,
    ) -> anyhow::Result<Upgraded> {
        let served = self.served_mut(&config.pool);
        if let Some(identity) = &claim {
            crate::serve::record_claim(&served.node, &config, identity).await?;
        }
        let gate =
            Gate { window: config.upgrade_window, max_failed_percent: config.upgrade_max_failed_percent };
        tracing::info!(pool = %config.pool, plugin = %config.name, from = %served.loaded.release, to = %loaded.release, window = ?gate.window, "replacing the plugin's workers one at a time, each judged by the upgrade gate");
        let options = crate::serve::worker_options(&config, &loaded.release);
        let judged = !gate.window.is_zero();
        for at in 0..served.workers.len() {
            let record = Arc::new(if judged { Record::on_trial() } else { Record::default() });
            let before = served.replace_worker(at, &loaded.plugin, &options, record.clone()).await?.figures();
            if !judged {
                continue;
            }
            let heir = &served.workers[at].id;
            let trial = crate::gate::TrialMetrics::start(&config.pool);
            let verdict = gate.judge(&record, before, signals.interrupted()).await;
            trial.verdict(&verdict, record.held_count());
            match verdict {
                Verdict::Passed(figures) => {
                    record.fail_held().await;
                    tracing::info!(pool = %config.pool, worker = %heir, release = %loaded.release, %figures, "the new release passed the upgrade gate");
                }
                Verdict::Interrupted => {
                    tracing::warn!(pool = %config.pool, release = %loaded.release, "asked to leave during the upgrade: the rollout stops here");
                    return Ok(Upgraded::Interrupted);
                }
                Verdict::Failed(why) => {
                    tracing::error!(pool = %config.pool, worker = %heir, release = %loaded.release, "the new release failed the upgrade gate; undoing it: {why}");
                    self.undo(&config, &loaded, at + 1, &why, claim.is_some()).await?;
                    return Ok(Upgraded::Undone);
                }
            }
        }
        let previous = std::mem::replace(&mut served.loaded, loaded);
        served.previous = keep_previous.then(|| (served.config.clone(), previous));
        self.resize(config).await?;
        Ok(Upgraded::Done)
    }

    /// Undoes release `new` of `config`'s plugin, which failed its gate on
    /// the first `replaced` workers: the pool records it as refused (so no
    /// host tries it again), the recorded handler goes back to the served
    /// release when `recorded` says the upgrade changed it, and each of
    /// those workers is replaced back by one running the served release.
    /// Their jobs move once more, with the state they saved and the events
    /// sent to them; the jobs the new release failed were held (see
    /// `gate`), so they start again here, with no attempt counted.
    async fn undo(
        &mut self,
        config: &PluginConfig,
        new: &LoadedPlugin,
        replaced: usize,
        why: &str,
        recorded: bool,
    ) -> anyhow::Result<()> {
        let host = self.options.identity.host.clone();
        let served = self.served_mut(&config.pool);
        let reason = format!(
            "release {} of plugin {:?} failed the upgrade gate on host {host} (node {}): {why}",
            new.release,
            config.name,
            served.node.id()
        );
        served.node.refuse_release(&new.release.digest, &reason).await?;
        if recorded {
            let identity = crate::serve::identity(&served.config, &served.loaded.release);
            served.node.record_handler(&identity).await?;
        }
        let options = crate::serve::worker_options(&served.config, &served.loaded.release);
        let plugin = served.loaded.plugin.clone();
        for at in 0..replaced {
            served.replace_worker(at, &plugin, &options, Arc::default()).await?;
        }
        tracing::warn!(pool = %config.pool, release = %new.release, refused = %new.release.digest, "release undone and refused for the pool; the workers run {} again", served.loaded.release);
        Ok(())
    }

    /// Closes the client-only nodes no schedule runs on any more.
    async fn close_unused_clients(&mut self) {
        let (used, unused): (Vec<_>, Vec<_>) = std::mem::take(&mut self.clients)
            .into_iter()
            .partition(|node| self.schedules.iter().any(|running| Arc::ptr_eq(&running.node, node)));
        self.clients = used;
        for node in unused {
            node.close().await;
            let served_here = self.served.iter().any(|served| served.config.pool == node.pool());
            if let Some(api) = self.api
                && !served_here
            {
                api.remove_pool(node.pool());
            }
        }
    }

    /// Adds or removes workers of `config`'s plugin to `config`'s number
    /// (the last joined leave first); whether it changed any.
    async fn resize(&mut self, config: PluginConfig) -> anyhow::Result<bool> {
        let served = self.served_mut(&config.pool);
        served.config = config;
        let wanted = served.config.workers as usize;
        let changed = served.workers.len() != wanted;
        while served.workers.len() < wanted {
            served.add_worker().await?;
        }
        while served.workers.len() > wanted {
            let worker = served.workers.pop().expect("more than wanted");
            served.node.remove_worker(&worker.id).await?;
            tracing::info!(pool = %served.config.pool, worker = %worker.id, "worker removed");
        }
        Ok(changed)
    }

    /// Says which changed sections take effect only at the next start.
    fn warn_of_restart_only(&self, new: &Config) {
        let old = &self.config;
        let http_rest = |http: &Option<pulse_config::HttpConfig>| {
            http.clone().map(|http| pulse_config::HttpConfig { token: None, ..http })
        };
        let sections = [
            ("[redis]", old.redis != new.redis),
            ("[node]", old.node != new.node),
            ("[runtime]", old.runtime != new.runtime),
            ("[http] (but its token)", http_rest(&old.http) != http_rest(&new.http)),
        ];
        for (section, changed) in sections {
            if changed {
                tracing::warn!(
                    "{section} changed: it takes effect when the host starts again; kept as it was"
                );
            }
        }
    }
}
