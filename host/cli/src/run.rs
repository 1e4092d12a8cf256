//! `pulse-host run`: loads the plugins and producers, joins their pools,
//! adds their workers, starts the schedules, and serves until SIGINT or
//! SIGTERM; then the schedules end here, every worker leaves (its jobs move
//! to the other hosts, or wait for a worker) and the host exits. A second
//! signal exits at once. SIGHUP reloads config.toml (`reload`).

use anyhow::Context;
use pulse_config::{Config, Isolation};
use pulse_pool::NodeOptions;
use pulse_runtime::{Limits, PluginOptions, ProducerOptions, Runtime, RuntimeConfig};

use crate::serve::Host;

/// What a host runs: the runtime, and every plugin and producer of the
/// configuration, loaded and checked.
#[derive(Debug)]
pub struct Loaded {
    /// The runtime (kept alive while plugins run).
    pub runtime: Runtime,
    /// The `[[plugin]]`s, in file order.
    pub plugins: Vec<pulse_runtime::Plugin>,
    /// The producers of the `[[schedule]]`s, in file order.
    pub producers: Vec<pulse_runtime::Producer>,
}

/// Builds the runtime and loads every plugin and producer, refusing any
/// that is not a valid job handler or job producer.
pub fn load(config: &Config) -> anyhow::Result<Loaded> {
    let (runtime, plugins, producers) = crate::serve::load_all(config)?;
    Ok(Loaded {
        runtime,
        plugins: plugins.into_iter().map(|loaded| loaded.plugin).collect(),
        producers: producers.into_iter().map(|loaded| loaded.producer).collect(),
    })
}

/// How the runtime runs a plugin: its `[[plugin]]` section.
pub(crate) fn plugin_options(plugin: &pulse_config::PluginConfig) -> anyhow::Result<PluginOptions> {
    Ok(PluginOptions {
        limits: limits(&plugin.limits),
        settings: settings(&plugin.settings),
        isolation: match plugin.isolation {
            Isolation::Job => pulse_runtime::Isolation::Job,
            Isolation::Worker => pulse_runtime::Isolation::Worker,
        },
        outbound: outbound(
            "plugin",
            &plugin.name,
            &plugin.allowed_outbound_hosts,
            plugin.outbound_ca_file.as_deref(),
            &plugin.limits,
        )?
        .fenced_by(plugin.outbound_fence_header.as_deref())
        .with_context(|| format!("plugin {:?}: outbound_fence_header", plugin.name))?,
    })
}

/// How the runtime runs a schedule's producer: its `[[schedule]]` section.
pub(crate) fn producer_options(schedule: &pulse_config::ScheduleConfig) -> anyhow::Result<ProducerOptions> {
    Ok(ProducerOptions {
        limits: limits(&schedule.limits),
        settings: settings(&schedule.settings),
        outbound: outbound(
            "schedule",
            &schedule.name,
            &schedule.allowed_outbound_hosts,
            schedule.outbound_ca_file.as_deref(),
            &schedule.limits,
        )?
        .fenced_by(None)?,
    })
}

/// The values of a plugin's or producer's settings, as it reads them.
fn settings(
    settings: &std::collections::BTreeMap<String, pulse_config::Setting>,
) -> std::collections::BTreeMap<String, String> {
    settings.iter().map(|(name, value)| (name.clone(), value.value().to_owned())).collect()
}

/// What a plugin or producer may reach over HTTP: its
/// `allowed_outbound_hosts`, each entry checked, the authorities of its
/// `outbound_ca_file`, and its `http_` limits.
fn outbound(
    what: &str,
    name: &str,
    allowed: &[String],
    ca_file: Option<&std::path::Path>,
    limits: &pulse_config::Limits,
) -> anyhow::Result<pulse_runtime::Outbound> {
    let allowed = allowed
        .iter()
        .map(|entry| entry.parse())
        .collect::<Result<_, pulse_runtime::AllowedHostError>>()
        .with_context(|| format!("{what} {name:?}: allowed_outbound_hosts"))?;
    let tls = match ca_file {
        Some(path) => pulse_runtime::OutboundTls::with_ca_file(path)
            .with_context(|| format!("{what} {name:?}: outbound_ca_file"))?,
        None => pulse_runtime::OutboundTls::default(),
    };
    Ok(pulse_runtime::Outbound {
        allowed,
        connect_timeout: limits.http_connect_timeout,
        first_byte_timeout: limits.http_first_byte_timeout,
        max_request_bytes: limits.http_request_bytes,
        max_response_bytes: limits.http_response_bytes,
        max_requests: limits.http_requests,
        tls,
        ..pulse_runtime::Outbound::default()
    })
}

/// The runtime's configuration from `[runtime]`.
pub(crate) fn runtime_config(config: &Config) -> RuntimeConfig {
    let runtime_config = RuntimeConfig::default()
        .max_instances(config.runtime.max_instances)
        .ready_instances(config.runtime.ready_instances)
        .max_memory_per_instance(config.runtime.max_memory_per_instance)
        .memory_reservation(config.runtime.memory_reservation)
        .fuel(config.runtime.fuel);
    // Compiled code goes to a folder of its own: wasmtime's cache cleans
    // its folder of files it did not write, such as pulled components
    // (`oci/`).
    match &config.runtime.cache_dir {
        Some(dir) => runtime_config.cache_dir(dir.join("compiled")),
        None => runtime_config,
    }
}

fn limits(limits: &pulse_config::Limits) -> Limits {
    Limits {
        memory: limits.memory,
        call_timeout: limits.call_timeout,
        fuel: limits.fuel,
        instances: Some(limits.instances),
    }
}

pub fn node_options(config: &Config) -> NodeOptions {
    NodeOptions {
        max_jobs: config.node.max_jobs,
        max_payload: usize::try_from(config.node.max_payload).unwrap_or(usize::MAX),
        reply_timeout: config.node.reply_timeout,
        confirm_replicas: config.node.confirm_replicas,
        slot_groups: config.node.slot_groups,
        max_attempts: config.node.max_attempts,
        retry_backoff: config.node.retry_backoff,
        events_retention: usize::try_from(config.node.events_retention).unwrap_or(usize::MAX),
        lease_ttl: config.node.lease_ttl,
        events_max_bytes: config.node.events_max_bytes,
        shutdown_timeout: config.node.shutdown_timeout,
        ..NodeOptions::default()
    }
}

/// The process's async runtime, with `threads` worker threads (the
/// config's `runtime.threads`); 0 leaves the count to tokio:
/// `TOKIO_WORKER_THREADS`, else one per core. A host that shared two
/// cores with Redis spent less CPU a job on one thread than on two
/// (BENCHMARKS.md, "Fewer threads than cores").
pub fn async_runtime(threads: u32) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        builder.worker_threads(threads as usize);
    }
    builder.enable_all().build()
}

/// # Cancel safety
/// Not cancel safe: dropping it skips the leaving; the host's workers are
/// then evicted when their leases end.
pub async fn run(config: &Config, client: &pulse_redis::Redis) -> anyhow::Result<()> {
    crate::pages::prefer_small_pages();
    // The process's root token: the HTTP server and every node take a
    // child of it. Cancelled on the way out, it ends whatever did not end
    // in order (after a second signal, the nodes still leaving: their
    // workers fence themselves at once).
    let root = tokio_util::sync::CancellationToken::new();
    // First: the API answers /healthz (and /readyz: not yet) while plugins
    // load, and the metrics recorder must exist before they take handles.
    let http = match &config.http {
        Some(http) => Some(Http::start(http, root.child_token()).await?),
        None => None,
    };
    // What the pool's listings show of this host's nodes.
    let identity = pulse_pool::Identity {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        http: http.as_ref().map(|http| format!("http://{}", http.address)),
        ..pulse_pool::Identity::default()
    };
    let options = NodeOptions { cancel: root.clone(), identity, ..node_options(config) };
    let result = serve(config, client, &options, http.as_ref().map(|h| &h.api)).await;
    root.cancel();
    if let Some(http) = http {
        http.stop().await;
    }
    result
}

/// The HTTP token: PULSE_HTTP_TOKEN when set (so it need not be in a
/// file), else `http.token` or the content of `http.token_file`.
pub(crate) fn http_token(config: &pulse_config::HttpConfig) -> anyhow::Result<Option<pulse_config::Secret>> {
    match std::env::var("PULSE_HTTP_TOKEN") {
        Ok(token) => match pulse_config::check_token(&token) {
            Ok(()) => Ok(Some(pulse_config::Secret::new(token))),
            Err(allowed) => anyhow::bail!("PULSE_HTTP_TOKEN {allowed}"),
        },
        Err(_) => Ok(config.token.clone()),
    }
}

/// The HTTP API, served by a task of its own.
struct Http {
    api: pulse_http::Api,
    /// The address it listens on.
    address: std::net::SocketAddr,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Http {
    async fn start(
        config: &pulse_config::HttpConfig,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<Self> {
        let metrics = pulse_http::metrics::install();
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("failed to listen on {} (http.listen)", config.listen))?;
        let address = listener.local_addr().context("failed to read the HTTP address")?;
        let token = http_token(config)?;
        if !address.ip().is_loopback() && token.is_none() {
            tracing::warn!(%address, "the HTTP API listens beyond this machine without http.token: anyone who reaches it can dispatch and stop jobs");
        }
        let api = pulse_http::Api::new(pulse_http::ApiOptions {
            token: token.map(|token| token.expose().to_owned()),
            max_body: usize::try_from(config.max_body).unwrap_or(usize::MAX),
            metrics: Some(metrics),
            hosts: pulse_http::AllowedHosts {
                loopback: address.ip().is_loopback(),
                names: config.allowed_hosts.clone(),
            },
        });
        let tls = match &config.tls {
            Some((cert, key)) => Some(pulse_http::tls_config(cert, key).map_err(anyhow::Error::msg)?),
            None => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let serving = pulse_http::ServeOptions {
            header_timeout: config.header_timeout,
            idle_timeout: config.idle_timeout,
            max_connections: config.max_connections as usize,
            tls,
        };
        let task = tokio::spawn(pulse_http::serve(listener, api.clone(), shutdown.clone(), serving));
        tracing::info!(%address, "serving the HTTP API, metrics and status page on {scheme}://{address}/");
        Ok(Self { api, address, shutdown, task })
    }

    /// Stops serving: requests in flight get a few seconds to finish.
    async fn stop(mut self) {
        self.shutdown.cancel();
        match tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(error = %error, "the HTTP server failed"),
            Ok(Err(error)) => tracing::warn!(error = %error, "the HTTP server task failed"),
            Err(_elapsed) => {
                tracing::warn!("HTTP requests still running after 5 s; closing them");
                self.task.abort();
            }
        }
    }
}

async fn serve(
    config: &Config,
    client: &pulse_redis::Redis,
    options: &NodeOptions,
    api: Option<&pulse_http::Api>,
) -> anyhow::Result<()> {
    let mut signals = Signals::new()?;
    let mut host = Host::start(config, client, options, api).await?;
    if let Some(api) = api {
        api.set_ready();
    }
    tracing::info!(
        pools = host.served.len(),
        schedules = host.schedules.len(),
        threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "running; Ctrl-C or SIGTERM to leave, SIGHUP to reload {}",
        config.path.display()
    );
    // A host with workers exits once all its pools shut down; one that
    // only runs schedules, on a signal.
    let mut rollouts = tokio::time::interval(crate::rollout::FOLLOW_EVERY);
    rollouts.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let signalled = loop {
        let signal = tokio::select! {
            signal = signals.next() => signal,
            () = host.all_shut_down() => {
                tracing::info!("every pool of this host was shut down; exiting");
                break false;
            }
            _ = rollouts.tick() => {
                host.follow_rollouts(&mut signals).await;
                if host.leave_requested {
                    break true;
                }
                continue;
            }
        };
        match signal {
            Signal::Leave => break true,
            Signal::Reload => match host.reload(&mut signals).await {
                Ok(summary) => tracing::info!(%summary, "reloaded {}", host.config.path.display()),
                Err(error) => tracing::error!("{error}"),
            },
        }
        if host.leave_requested {
            break true;
        }
    };
    if let Some(api) = api {
        api.set_leaving();
    }
    if signalled {
        tracing::info!("leaving: handing jobs to the other hosts (a second signal exits at once)");
    }
    tokio::select! {
        () = host.leave() => {}
        () = signals.leave() => {
            tracing::warn!("second signal: exiting without handing the remaining jobs over");
        }
    }
    Ok(())
}

/// What a signal asks of the host.
enum Signal {
    /// SIGINT or SIGTERM.
    Leave,
    /// SIGHUP.
    Reload,
}

/// The signals a running host answers, listened to for its whole life so
/// none is missed between two waits.
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("failed to listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("failed to listen for SIGTERM")?,
            hangup: signal(SignalKind::hangup()).context("failed to listen for SIGHUP")?,
        })
    }

    /// The next signal.
    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::Leave,
            _ = self.terminate.recv() => Signal::Leave,
            _ = self.hangup.recv() => Signal::Reload,
        }
    }

    /// The next SIGINT or SIGTERM, during a reload (another SIGHUP then is
    /// ignored).
    pub(crate) async fn interrupted(&mut self) {
        loop {
            if let Signal::Leave = self.next().await {
                return;
            }
            tracing::warn!("SIGHUP during a reload: ignored (send it again once the reload is done)");
        }
    }

    /// The next SIGINT or SIGTERM (a reload while leaving is ignored).
    async fn leave(&mut self) {
        loop {
            if let Signal::Leave = self.next().await {
                return;
            }
            tracing::warn!("SIGHUP while leaving: nothing is reloaded");
        }
    }
}
