//! The task of a full node: its leases renewed, the janitor run, the
//! pool's shutdown noticed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::{Core, tick};

/// The task of a full node: renews its leases, runs the janitor and
/// watches for the pool shutting down, every tick until `token` is
/// cancelled.
pub(crate) async fn run(core: Arc<Core>, token: CancellationToken, shutdown: watch::Sender<bool>) {
    let mut ticks = tokio::time::interval(tick(core.options.lease_ttl));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When a lease ends (plus the grace) before the next tick, the janitor
    // wakes then too: a dead node's jobs move up to a tick sooner.
    let mut evict_at: Option<Instant> = None;
    loop {
        let due = async {
            match evict_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            _ = ticks.tick() => {}
            () = due => {
                evict_at = None;
                janitor_round(&core, &mut evict_at).await;
                continue;
            }
        }
        match core.renew().await {
            Ok(true) => {
                // The pool is going away: its keys are about to be removed,
                // and a renewal then would take that for lost data.
                shutdown.send_replace(true);
                token.cancelled().await;
                return;
            }
            Ok(false) => {}
            Err(error) => {
                core.metrics.renewals_failed.increment(1);
                tracing::warn!(error = %error, "failed to renew leases");
            }
        }
        janitor_round(&core, &mut evict_at).await;
    }
}

/// Runs the janitor; sets `evict_at` when the next eviction is due before
/// the next tick.
async fn janitor_round(core: &Core, evict_at: &mut Option<Instant>) {
    match core.janitor().await {
        Ok(Some(next)) if next < tick(core.options.lease_ttl) => {
            // A millisecond late rather than early: Redis's clock decides.
            *evict_at = Some(Instant::now() + next + Duration::from_millis(1));
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %error, "janitor round failed"),
    }
}
