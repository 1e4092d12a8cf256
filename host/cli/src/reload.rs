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
//!   once, to its heir, with their saved state, and no other job moves;
//! - only `workers` changed: workers are added or leave;
//! - a plugin gone from the file: its workers leave (their jobs move to
//!   the pool's other hosts, or wait); a new one: its pool is joined.
//!
//! Schedules that changed start again; the HTTP token takes effect at
//! once. `[redis]`, `[node]`, `[runtime]` and the rest of `[http]` take
//! effect at the next start: a reload says so and keeps them.

use std::fmt;

use pulse_config::{Config, PluginConfig};

use crate::adapter::WasmHandler;
use crate::serve::{
    Host, LoadedPlugin, LoadedProducer, check_claim, digest, load_plugin, load_producer, read_file,
};

/// What a reload changed.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    /// Plugins whose workers were replaced by a new load.
    upgraded: Vec<String>,
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

/// What to do with one `[[plugin]]` of the new file.
enum Change {
    /// Nothing (maybe the number of workers).
    Keep(usize, PluginConfig),
    /// Replace the workers of served plugin `index` by `loaded`'s; record
    /// the identity when the pool must learn of the new release.
    Upgrade(usize, PluginConfig, LoadedPlugin, Option<String>),
    /// Join a pool this host did not serve.
    Add(PluginConfig, LoadedPlugin),
}

impl Host<'_> {
    /// Reloads the configuration file (see the module's documentation).
    ///
    /// # Errors
    /// What refused the reload: nothing was changed then. A failure while
    /// changing workers (Redis) stops the reload where it was.
    pub(crate) async fn reload(&mut self) -> anyhow::Result<Summary> {
        let new = crate::defaults::load_config(&self.config.path)?;
        self.warn_of_restart_only(&new);
        // Check and load everything first: nothing changes unless all of
        // it is right.
        let mut changes = Vec::new();
        for config in &new.plugins {
            let index = self.served.iter().position(|served| served.config.pool == config.pool);
            let change = match index {
                Some(index) => {
                    let served = &self.served[index];
                    let bytes = read_file(&config.path)?;
                    let same_section = PluginConfig { workers: served.config.workers, ..config.clone() };
                    if same_section == served.config && digest(&bytes) == served.loaded.release.digest {
                        Change::Keep(index, config.clone())
                    } else {
                        let loaded = load_plugin(&self.runtime, config)?;
                        let record = check_claim(&served.node, config, &loaded.release).await?;
                        Change::Upgrade(index, config.clone(), loaded, record)
                    }
                }
                None => Change::Add(config.clone(), load_plugin(&self.runtime, config)?),
            };
            changes.push(change);
        }
        let mut producers: Vec<Option<LoadedProducer>> = Vec::new();
        for config in &new.schedules {
            let running =
                self.schedules.iter().find(|s| s.config.name == config.name && s.config.pool == config.pool);
            let unchanged = match running {
                Some(running) => {
                    running.config == *config && digest(&read_file(&config.path)?) == running.digest
                }
                None => false,
            };
            producers.push(if unchanged { None } else { Some(load_producer(&self.runtime, config)?) });
        }
        if let Some(http) = &new.http {
            crate::run::http_token(http)?;
        }

        let mut summary = Summary::default();
        // Schedules that end or change stop first: none runs on a node
        // that leaves.
        let before = self.schedules.len();
        self.schedules.retain(|running| {
            new.schedules.iter().zip(&producers).any(|(config, producer)| {
                producer.is_none() && config.name == running.config.name && config.pool == running.config.pool
            })
        });
        summary.schedules += before - self.schedules.len();
        // Plugins gone from the file: their workers leave.
        let mut index = 0;
        while index < self.served.len() {
            if new.plugins.iter().any(|config| config.pool == self.served[index].config.pool) {
                index += 1;
                continue;
            }
            let served = self.served.remove(index);
            served.node.close().await;
            if let Some(api) = self.api {
                api.remove_pool(&served.config.pool);
            }
            tracing::info!(pool = %served.config.pool, plugin = %served.config.name, "plugin removed: its workers left");
            summary.removed.push(served.config.name);
            // Indices of the changes computed before are by pool.
            for change in &mut changes {
                match change {
                    Change::Keep(i, _) | Change::Upgrade(i, ..) if *i > index => *i -= 1,
                    _ => {}
                }
            }
        }
        for change in changes {
            match change {
                Change::Keep(index, config) => {
                    if self.resize(index, config).await? {
                        summary.resized.push(self.served[index].config.name.clone());
                    }
                }
                Change::Upgrade(index, config, loaded, record) => {
                    self.upgrade(index, config, loaded, record).await?;
                    summary.upgraded.push(self.served[index].config.name.clone());
                }
                Change::Add(config, loaded) => {
                    let name = config.name.clone();
                    self.add_plugin(config, loaded).await?;
                    summary.added.push(name);
                }
            }
        }
        for (config, producer) in new.schedules.iter().zip(producers) {
            if let Some(loaded) = producer {
                self.start_schedule(config.clone(), loaded).await?;
                summary.schedules += 1;
            }
        }
        if let (Some(api), Some(http)) = (self.api, &new.http) {
            let token = crate::run::http_token(http)?;
            api.set_token(token.map(|token| token.expose().to_owned()));
        }
        self.config.plugins = new.plugins;
        self.config.schedules = new.schedules;
        if let (Some(running), Some(http)) = (&mut self.config.http, new.http) {
            running.token = http.token;
        }
        Ok(summary)
    }

    /// Replaces each worker of served plugin `index`, one at a time, by
    /// one running `loaded`; then adds or removes workers to `config`'s
    /// number.
    async fn upgrade(
        &mut self,
        index: usize,
        config: PluginConfig,
        loaded: LoadedPlugin,
        record: Option<String>,
    ) -> anyhow::Result<()> {
        let served = &mut self.served[index];
        if let Some(identity) = record {
            crate::serve::record_claim(&served.node, &config, &identity).await?;
        }
        tracing::info!(pool = %config.pool, plugin = %config.name, from = %served.loaded.release, to = %loaded.release, "replacing the plugin's workers one at a time");
        let options = crate::serve::worker_options(&config, &loaded.release);
        for old in std::mem::take(&mut served.workers) {
            let handler = WasmHandler::new(&loaded.plugin);
            let heir = served.node.replace_worker(&old, handler, options.clone()).await?;
            tracing::info!(pool = %config.pool, worker = %heir, replaced = %old, release = %loaded.release, "worker replaced");
            served.workers.push(heir);
        }
        served.loaded = loaded;
        self.resize(index, config).await?;
        Ok(())
    }

    /// Adds or removes workers of served plugin `index` to `config`'s
    /// number (the last joined leave first); whether it changed any.
    async fn resize(&mut self, index: usize, config: PluginConfig) -> anyhow::Result<bool> {
        let served = &mut self.served[index];
        served.config = config;
        let wanted = served.config.workers as usize;
        let changed = served.workers.len() != wanted;
        while served.workers.len() < wanted {
            served.add_worker().await?;
        }
        while served.workers.len() > wanted {
            let worker = served.workers.pop().expect("more than wanted");
            served.node.remove_worker(&worker).await?;
            tracing::info!(pool = %served.config.pool, worker, "worker removed");
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
