//! Following a release announced for the whole pool (`pulse-host rollout
//! start --pool P --file FILE`). Every second the host reads the record of each
//! pool it serves (`pulse_pool::Rollout`) and:
//!
//! - while it runs and this host serves another release: takes the turn
//!   (one host at a time), loads the file from the announced path, checks
//!   its digest is the announced one, and replaces its workers one at a
//!   time, each judged by the upgrade gate (`reload::upgrade`, the same
//!   path as a SIGHUP). Then it gives the turn back: done, or halted with
//!   the gate's reason (the gate undid the release here, and the pool
//!   refuses it: no other host tries it);
//! - while it runs and this host serves it already: says so, once;
//! - while it is undone (`rollout undo`) and this host took it: replaces its
//!   workers back by the release it ran before (kept loaded until then),
//!   each job moving once more from its saved state.
//!
//! A paused or halted rollout is left alone. The turn lasts as long as the
//! host's workers take to be judged, plus two minutes: a host that dies in
//! its turn holds the others up that long at most.

use std::sync::Arc;
use std::time::Duration;

use pulse_config::{PluginConfig, Source};
use pulse_pool::{Rollout, RolloutOutcome, RolloutState};

use crate::reload::Upgraded;
use crate::run::Signals;
use crate::serve::{Component, Host, check_claim, load_plugin};

/// How often a host reads the pool's rollout.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Beyond the gate's windows, how long a host may hold the turn.
const TURN_SLACK: Duration = Duration::from_secs(120);

impl Host<'_> {
    /// Follows the rollout of every pool this host serves (see the
    /// module's documentation); stops early when asked to leave.
    pub(crate) async fn follow_rollouts(&mut self, signals: &mut Signals) {
        for index in 0..self.served.len() {
            let pool = self.served[index].config.pool.clone();
            if let Err(error) = self.follow_rollout(&pool, signals).await {
                tracing::warn!(pool = %pool, error = format!("{error:#}"), "failed to follow the pool's rollout");
            }
            if self.leave_requested {
                return;
            }
        }
    }

    async fn follow_rollout(&mut self, pool: &str, signals: &mut Signals) -> anyhow::Result<()> {
        let served = self.served_mut(pool);
        let Some(rollout) = served.node.rollout().await? else { return Ok(()) };
        let node = served.node.clone();
        let here = served.loaded.release.digest == rollout.digest;
        let said = rollout.hosts.get(node.id()).map(String::as_str);
        match rollout.state {
            RolloutState::Running if here => {
                if said != Some("done") {
                    node.report_rollout(&rollout.digest, &RolloutOutcome::Done).await?;
                }
            }
            RolloutState::Running => {
                if node.refused_release(&rollout.digest).await?.is_some() {
                    return Ok(()); // a gate refused it: it halts
                }
                let ttl = served.config.upgrade_window * (served.workers.len() as u32 + 1) + TURN_SLACK;
                if !node.take_rollout_turn(&rollout.digest, ttl).await? {
                    return Ok(());
                }
                let outcome = self.take(pool, &rollout, signals).await;
                node.report_rollout(&rollout.digest, &outcome).await?;
            }
            RolloutState::Undoing if here => {
                if self.go_back(pool).await? {
                    node.report_rollout(&rollout.digest, &RolloutOutcome::Undone).await?;
                } else if said.is_none() {
                    tracing::warn!(pool, release = %rollout.digest, "the rollout is undone, but this host did not take the release from it and has no earlier release loaded: restart it with the file its config names");
                    node.report_rollout(&rollout.digest, &RolloutOutcome::Undone).await?;
                }
            }
            RolloutState::Undoing | RolloutState::Paused | RolloutState::Halted => {}
        }
        Ok(())
    }

    /// This host's turn: loads the announced release and upgrades to it.
    async fn take(&mut self, pool: &str, rollout: &Rollout, signals: &mut Signals) -> RolloutOutcome {
        let host = self.options.identity.host.clone();
        let cache_dir = self.config.runtime.cache_dir.clone();
        let served = self.served_mut(pool);
        let node = served.node.clone();
        let config = PluginConfig {
            source: match announced_source(&rollout.path, &served.config.source) {
                Ok(source) => source,
                Err(error) => {
                    tracing::error!(pool, release = %rollout.digest, "the announced release cannot run here; the rollout halts: {error:#}");
                    return RolloutOutcome::Halted(format!("host {host}: {error:#}"));
                }
            },
            version: rollout.version.clone(),
            ..served.config.clone()
        };
        tracing::info!(pool, release = %rollout.digest, path = %rollout.path, "this host's turn in the pool's rollout");
        let loaded = async {
            let file = Component::fetch(&config.source, cache_dir.as_deref())?;
            if file.digest != rollout.digest {
                anyhow::bail!(
                    "{} is {}, not the release announced ({}): every host must have the same file at that path",
                    config.source,
                    file.digest,
                    rollout.digest
                );
            }
            let loaded = load_plugin(&self.runtime, &config, file)?;
            let claim = check_claim(&node, &config, &loaded.release).await?;
            anyhow::Ok((loaded, claim))
        };
        let (loaded, claim) = match loaded.await {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::error!(pool, release = %rollout.digest, "the announced release cannot run here; the rollout halts: {error:#}");
                return RolloutOutcome::Halted(format!("host {host}: {error:#}"));
            }
        };
        match self.upgrade(config, loaded, claim, signals, true).await {
            Ok(Upgraded::Done) => RolloutOutcome::Done,
            Ok(Upgraded::Undone) => {
                let why = node.refused_release(&rollout.digest).await.ok().flatten();
                RolloutOutcome::Halted(
                    why.unwrap_or_else(|| format!("host {host}: the upgrade gate refused it")),
                )
            }
            Ok(Upgraded::Interrupted) => {
                self.leave_requested = true;
                RolloutOutcome::Yielded
            }
            Err(error) => {
                tracing::error!(pool, release = %rollout.digest, "the rollout failed part way on this host: {error:#}");
                RolloutOutcome::Yielded
            }
        }
    }

    /// Replaces the workers of `pool`'s plugin back by the release they
    /// ran before this host took a release announced for the pool;
    /// whether it had one.
    async fn go_back(&mut self, pool: &str) -> anyhow::Result<bool> {
        let served = self.served_mut(pool);
        let Some((config, loaded)) = served.previous.take() else { return Ok(false) };
        served.node.record_handler(&crate::serve::identity(&config, &loaded.release)).await?;
        let options = crate::serve::worker_options(&config, &loaded.release);
        tracing::info!(pool, from = %served.loaded.release, to = %loaded.release, "the pool's rollout is undone: replacing the workers back one at a time");
        for at in 0..served.workers.len() {
            served.replace_worker(at, &loaded.plugin, &options, Arc::default()).await?;
        }
        served.loaded = loaded;
        served.config = config;
        Ok(true)
    }
}

/// Where an announced release is: a file, or a registry reference (`rollout
/// start` announces either). A plugin that asks for signed releases
/// (`verify`) checks the announced one with the same key, and takes no
/// file.
fn announced_source(path: &str, configured: &Source) -> anyhow::Result<Source> {
    let verify = match configured {
        Source::Registry { verify, .. } => verify.clone(),
        Source::File(_) => None,
    };
    if !pulse_oci::is_reference(path) {
        if let Some(key) = verify {
            anyhow::bail!(
                "the plugin takes only releases signed for {} (verify), and the rollout announced a file, {path}: \
                 announce the release's registry reference instead",
                key.display()
            );
        }
        return Ok(Source::File(path.into()));
    }
    let reference = pulse_oci::Reference::parse(path).map_err(anyhow::Error::msg)?;
    Ok(Source::Registry { reference, verify })
}
