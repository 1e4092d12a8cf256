//! `pulse-host`: runs job handler plugins as workers of Redis-coordinated
//! pools, and drives their jobs from the command line.
//!
//! # Layout
//! - this file: the command line (clap), logging, exit codes.
//! - the library (`lib.rs`): `run` (`pulse-host run`: plugins, pools,
//!   workers, signals) and `adapter` (a plugin as a pool worker, the one
//!   place that sees both).
//! - `client`: the client commands, their output and exit codes.
//! - `jobs_file`: `dispatch --from-file`, every line checked before any is
//!   sent.
//! - `embedded`: the private `redis-server` used when no URL is given.
#![allow(clippy::print_stdout, reason = "the binary owns the output")]

mod client;
mod embedded;
mod jobs_file;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use pulse_config::{Config, ConfigError, Secret};
use pulse_host::run;
use pulse_pool::RolloutState;

use crate::client::exit;

/// mimalloc, not glibc's malloc: see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs keyed, long-running jobs as sandboxed WebAssembly components across
/// machines that share a Redis.
#[derive(Debug, Parser)]
#[command(name = "pulse-host", version)]
struct Cli {
    /// The configuration file.
    #[arg(long, global = true, default_value = "config.toml")]
    config: PathBuf,
    /// The Redis to use, instead of the config's `redis.url` or the private
    /// server of the config's data directory.
    /// A password in it is never printed.
    #[arg(long, global = true, env = "PULSE_REDIS_URL", hide_env_values = true)]
    redis: Option<Secret>,
    /// Log format on stderr (level from RUST_LOG; default info for `run`
    /// and `check`, warn for the client commands).
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// What `rollout` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RolloutAction {
    Status,
    Start,
    Pause,
    Resume,
    Undo,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the configured plugins as workers until SIGINT or SIGTERM.
    Run,
    /// Checks the configuration and loads every plugin, running nothing.
    Check,
    /// Dispatches a job (or many, with --from-file); waits until a worker
    /// started it.
    Dispatch {
        #[arg(long)]
        pool: String,
        #[arg(required_unless_present = "from_file")]
        key: Option<String>,
        /// JSON lines `{"key": "…", "payload": "…"}` (payload optional): one
        /// job per line, dispatched 1,000 at a time. Every line is checked
        /// first: if one is refused, none is sent.
        #[arg(long, conflicts_with_all = ["key", "payload", "payload_file"])]
        from_file: Option<PathBuf>,
        /// The payload, as text.
        #[arg(long, conflicts_with = "payload_file")]
        payload: Option<String>,
        /// A file whose bytes are the payload.
        #[arg(long)]
        payload_file: Option<PathBuf>,
    },
    /// Stops a job.
    Stop {
        #[arg(long)]
        pool: String,
        key: String,
    },
    /// Sends a notification to a job.
    Notify {
        #[arg(long)]
        pool: String,
        key: String,
        #[arg(long, default_value = "")]
        payload: String,
    },
    /// Shows one job.
    Status {
        #[arg(long)]
        pool: String,
        key: String,
        #[arg(long)]
        json: bool,
    },
    /// Starts a failed job again from its first attempt.
    Retry {
        #[arg(long)]
        pool: String,
        key: String,
    },
    /// Removes a failed job, freeing its key.
    Forget {
        #[arg(long)]
        pool: String,
        key: String,
    },
    /// Shuts a pool down: every host stops the pool's jobs (their
    /// handlers' `stop`), its workers leave, and the pool's Redis state is
    /// removed. Hosts serving only this pool exit.
    Shutdown {
        #[arg(long)]
        pool: String,
        /// How long to wait for the hosts to stop their jobs; hosts that
        /// do not answer (dead ones) are not waited for longer.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: std::time::Duration,
    },
    /// Lists the jobs of a pool.
    Jobs {
        #[arg(long)]
        pool: String,
        /// Only jobs in this state: starting, running, moving, queued or
        /// failed.
        #[arg(long)]
        state: Option<String>,
        /// Only jobs whose keys start with this.
        #[arg(long)]
        prefix: Option<String>,
        /// One page of about this many jobs (1 to 1,000), rather than
        /// every job; the next page's cursor goes to stderr.
        #[arg(long)]
        limit: Option<usize>,
        /// Where the page starts: the cursor the page before gave.
        #[arg(long, requires = "limit")]
        cursor: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Lists the workers of a pool.
    Workers {
        #[arg(long)]
        pool: String,
        #[arg(long)]
        json: bool,
    },
    /// Lists the nodes hosting workers of a pool.
    Nodes {
        #[arg(long)]
        pool: String,
        #[arg(long)]
        json: bool,
    },
    /// Shows which releases (digest and version) of its plugin a pool's
    /// workers run, on which hosts, with how many jobs: the progress of a
    /// rolling upgrade; and the releases the pool refuses (their upgrade
    /// gate failed), with why.
    Rollout {
        /// `status` (the default) shows the rollout; `start` announces
        /// `--file` as the pool's new release: every host serving the pool
        /// takes it in turn, one at a time, each worker judged by the
        /// upgrade gate; `pause` stops further hosts taking it, `resume`
        /// goes on; `undo` sends the hosts that took it back to the release
        /// they ran before.
        #[arg(value_enum, default_value_t = RolloutAction::Status)]
        action: RolloutAction,
        #[arg(long)]
        pool: String,
        /// The plugin file to announce (with `start`); it must be at this
        /// path on every host.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// The announced release's version (with `start`).
        #[arg(long)]
        version: Option<String>,
        /// Clears the pool's refusal of a release (its digest,
        /// `sha256:<hex>`, or `all`): hosts bringing it try it again.
        #[arg(long, value_name = "DIGEST")]
        clear: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Runs a job handler component in this process, without Redis, on a
    /// clock of its own, as SCRIPT says (steps `start KEY [PAYLOAD]`,
    /// `notify KEY PAYLOAD`, `advance 5s`, `stop KEY`, `crash-and-move
    /// KEY`, one a line); prints what it emits, saves and logs. Exit 5
    /// when it traps.
    Try {
        /// The component (`.wasm`).
        plugin: PathBuf,
        /// The script.
        script: PathBuf,
        /// A setting of the plugin, `KEY=VALUE` (repeatable), as in
        /// `[plugin.settings]`.
        #[arg(long = "settings", value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// A host the plugin's jobs may send HTTP requests to, as in
        /// `allowed_outbound_hosts` (repeatable).
        #[arg(long = "allow-outbound", value_name = "HOST")]
        allow_outbound: Vec<String>,
    },
    /// Writes a new plugin project NAME (a folder of that name, or DIR):
    /// a job handler that builds with the command it prints and runs
    /// under `try` with its `script.txt` as written.
    New {
        /// The plugin's name (a crate or package name).
        name: String,
        /// The language it is written in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: pulse_host::scaffold::Lang,
        /// The folder to write (default: ./NAME); it must not exist.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The Rust SDK to depend on (default: sdk/rust of the tree this
        /// binary was built from).
        #[arg(long, value_name = "PATH")]
        sdk: Option<PathBuf>,
    },
    /// Publishes a component to an OCI registry in the oci-wasm layout
    /// (`oci://REGISTRY/NAME[:TAG]`) and prints the reference pinned to
    /// its digest, for a plugin's `path`. Credentials, when the registry
    /// asks: PULSE_REGISTRY_USERNAME and PULSE_REGISTRY_PASSWORD.
    Push {
        /// The component (`.wasm`).
        file: PathBuf,
        /// Where: `oci://REGISTRY/NAME[:TAG]`.
        reference: String,
        /// A version to record in the manifest's annotations.
        #[arg(long)]
        version: Option<String>,
    },
    /// Signs a component in a registry (`oci://…@sha256:…` or a tag) with
    /// an ECDSA P-256 PEM key, in cosign's layout: a plugin's `verify =
    /// { key = "NAME.pub" }` and `cosign verify --key` accept it.
    Sign {
        /// The component's reference.
        reference: String,
        /// The private key (PEM; `keygen` writes one).
        #[arg(long)]
        key: PathBuf,
    },
    /// Writes a new signing key pair: NAME.key (private, PKCS#8 PEM,
    /// readable by its owner only) and NAME.pub.
    Keygen {
        /// The files' name, without extension.
        name: PathBuf,
    },
    /// Prints what the plugins of a pool emitted.
    Events {
        #[arg(long)]
        pool: String,
        /// Keep printing new events until interrupted.
        #[arg(long)]
        follow: bool,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if matches!(cli.command, Command::Run | Command::Check | Command::Try { .. }) {
        "info"
    } else {
        "warn"
    };
    if matches!(cli.command, Command::Try { .. } | Command::New { .. }) {
        init_logs(cli.log_format, default_level, None);
    }
    if let Command::Try { plugin, script, settings, allow_outbound } = &cli.command {
        return try_plugin(plugin, script, settings, allow_outbound);
    }
    if let Command::New { name, lang, dir, sdk } = &cli.command {
        return match pulse_host::scaffold::new(name, *lang, dir.as_deref(), sdk.as_deref()) {
            Ok((dest, build)) => {
                println!("wrote {}; build it with: cd {} && {build}", dest.display(), dest.display());
                ExitCode::from(exit::OK)
            }
            Err(error) => {
                eprintln!("pulse-host: {error:#}");
                ExitCode::from(exit::ERROR)
            }
        };
    }
    // config.toml, read once: the async runtime and traces start from it
    // before the logs, and the command runs with it. The registry's
    // commands need none.
    let registry =
        matches!(cli.command, Command::Push { .. } | Command::Sign { .. } | Command::Keygen { .. });
    let config = (!registry).then(|| pulse_host::defaults::load_config(&cli.config));
    // A configuration that cannot be read runs the command on the default
    // threads: the command itself says what is wrong with it.
    let threads = config.as_ref().and_then(|config| config.as_ref().ok()).map_or(0, |c| c.runtime.threads);
    let runtime = match pulse_host::run::async_runtime(threads) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pulse-host: failed to start the async runtime: {error}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let telemetry = start_telemetry(&cli, config.as_ref(), &runtime);
    init_logs(cli.log_format, default_level, telemetry.as_ref());
    let code = serve_command(cli, config, &runtime);
    if let Some(telemetry) = telemetry {
        runtime.block_on(telemetry.shutdown());
    }
    code
}

/// Traces, when config.toml (`config`, not read for the registry's
/// commands) has `[telemetry]` and the command talks to a pool. A
/// configuration that cannot be read starts none: the command itself says
/// what is wrong with it.
fn start_telemetry(
    cli: &Cli,
    config: Option<&Result<Config, ConfigError>>,
    runtime: &tokio::runtime::Runtime,
) -> Option<pulse_telemetry::Telemetry> {
    if let Command::Check = cli.command {
        return None;
    }
    let config = config?.as_ref().ok()?.telemetry.clone()?;
    let settings = pulse_telemetry::Settings {
        otlp_endpoint: config.otlp_endpoint,
        service_name: config.service_name,
        service_version: env!("CARGO_PKG_VERSION").to_owned(),
        sample_ratio: config.sample_ratio,
    };
    let _entered = runtime.enter();
    match pulse_telemetry::Telemetry::start(&settings) {
        Ok(telemetry) => Some(telemetry),
        Err(error) => {
            eprintln!("pulse-host: {error}; going on without traces");
            None
        }
    }
}

/// Runs a command of the multi-threaded runtime: with `config`, or one of
/// the registry's, which need none.
fn serve_command(
    cli: Cli,
    config: Option<Result<Config, ConfigError>>,
    runtime: &tokio::runtime::Runtime,
) -> ExitCode {
    let Some(config) = config else { return registry_command(&cli.command, runtime) };
    match runtime.block_on(execute(cli, config)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("pulse-host: {error:#}");
            ExitCode::from(exit::ERROR)
        }
    }
}

/// `push`, `sign` or `keygen`.
fn registry_command(command: &Command, runtime: &tokio::runtime::Runtime) -> ExitCode {
    let done = match command {
        Command::Push { file, reference, version } => {
            runtime.block_on(pulse_host::registry::push(file, reference, version.as_deref()))
        }
        Command::Sign { reference, key } => runtime.block_on(pulse_host::registry::sign(reference, key)),
        Command::Keygen { name } => pulse_host::registry::keygen(name),
        _ => unreachable!("main reads config.toml for every command but the registry's"),
    };
    match done {
        Ok(text) => {
            println!("{text}");
            ExitCode::from(exit::OK)
        }
        Err(error) => {
            eprintln!("pulse-host: {error:#}");
            ExitCode::from(exit::ERROR)
        }
    }
}

/// `try`: on a current-thread runtime whose clock stands still but for
/// the script's `advance` steps.
fn try_plugin(plugin: &Path, script: &Path, settings: &[String], allow_outbound: &[String]) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pulse-host: failed to start the async runtime: {error}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let tried = runtime.block_on(async {
        let loaded = pulse_host::local::load(plugin, settings, allow_outbound)?;
        pulse_host::local::run(loaded, script).await
    });
    match tried {
        Ok(false) => ExitCode::from(exit::OK),
        Ok(true) => ExitCode::from(exit::FAILED),
        Err(error) => {
            eprintln!("pulse-host: {error:#}");
            ExitCode::from(exit::ERROR)
        }
    }
}

fn init_logs(format: LogFormat, default_level: &str, telemetry: Option<&pulse_telemetry::Telemetry>) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let output = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(terminal);
    // Each layer has its own filter: the logs' level does not decide
    // which trace spans are exported, nor the reverse.
    let output = match format {
        LogFormat::Human => output.boxed(),
        LogFormat::Json => output.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(telemetry.map(pulse_telemetry::Telemetry::layer))
        .with(output.with_filter(filter))
        .init();
}

async fn execute(cli: Cli, config: Result<Config, ConfigError>) -> anyhow::Result<ExitCode> {
    // The cryptography of `rediss://`; an error means one is installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = config?;
    if let Command::Check = cli.command {
        run::load(&config)?;
        println!(
            "{}: valid; {} plugin(s) load as job handlers, {} schedule producer(s) as job producers",
            cli.config.display(),
            config.plugins.len(),
            config.schedules.len()
        );
        return Ok(ExitCode::from(exit::OK));
    }
    if let Command::Run = cli.command {
        let url = cli.redis.clone().or_else(|| config.redis.url.clone());
        let embedded = match url {
            Some(_) => None,
            None => Some(embedded::Embedded::start(&config.redis.data_dir).await?),
        };
        let url = url.or_else(|| embedded.as_ref().map(|e| Secret::new(e.url()))).context("no Redis")?;
        let client = open_redis(&url, &config.redis).await?;
        let result = run::run(&config, &client).await;
        if let Some(embedded) = embedded {
            embedded.stop().await;
        }
        return result.map(|()| ExitCode::from(exit::OK));
    }
    let url = match cli.redis.clone().or_else(|| config.redis.url.clone()) {
        Some(url) => url,
        None => {
            let url = embedded::url(&config.redis.data_dir);
            anyhow::ensure!(
                embedded::answers(&url).await,
                "no Redis: nothing answers at {} (start `pulse-host run` with this config, or give --redis)",
                embedded::socket(&config.redis.data_dir).display()
            );
            Secret::new(url)
        }
    };
    let client = open_redis(&url, &config.redis).await?;
    client_command(cli.command, &client, &config).await
}

/// Where Redis is, from `url` (TLS with the config's certificates for the
/// `rediss` forms), checked by connecting once: the server must answer and
/// be of the form the URL names. An error names the URL without its
/// password, and the forms allowed.
async fn open_redis(url: &Secret, config: &pulse_config::RedisConfig) -> anyhow::Result<pulse_redis::Redis> {
    let shown = pulse_config::redact_url(url.expose());
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("failed to read {} (redis TLS settings)", path.display()))
    };
    let tls = if config.tls_ca_file.is_none() && config.tls_client.is_none() {
        None
    } else {
        let root_cert = config.tls_ca_file.as_deref().map(read).transpose()?;
        let client_tls = match &config.tls_client {
            Some((cert, key)) => {
                Some(redis::ClientTlsConfig { client_cert: read(cert)?, client_key: read(key)? })
            }
            None => None,
        };
        Some(redis::TlsCertificates { client_tls, root_cert })
    };
    let redis = pulse_redis::Redis::open_with_tls(url.expose(), tls)
        .map_err(|error| anyhow::anyhow!("invalid Redis URL {shown:?}: {error}"))?
        .with_response_timeout(config.response_timeout);
    let form = redis.form();
    redis.verify().await.map_err(|error| match error {
        pulse_redis::Error::Redis(error)
            if url.expose().starts_with("rediss") && !error.is_connection_refusal() =>
        {
            anyhow::anyhow!(
                "the TLS handshake with Redis at {shown:?} failed ({error}): does the server speak TLS? \
                 (a plain server is named with redis://)"
            )
        }
        error => anyhow::anyhow!("cannot use Redis at {shown:?} ({form}): {error}"),
    })?;
    Ok(redis)
}

async fn client_command(
    command: Command,
    client: &pulse_redis::Redis,
    config: &pulse_config::Config,
) -> anyhow::Result<ExitCode> {
    let options = run::node_options(config);
    let pool = match &command {
        Command::Events { pool, follow, json } => return client::events(client, pool, *follow, *json).await,
        // A view of the pool, which does not join it (all read, but
        // `rollout --clear`).
        Command::Status { pool, .. }
        | Command::Jobs { pool, .. }
        | Command::Workers { pool, .. }
        | Command::Rollout { pool, .. }
        | Command::Nodes { pool, .. } => {
            let view = client::view(client, pool).await?;
            return finish(read(&view, command, config).await);
        }
        Command::Dispatch { pool, from_file: Some(file), .. } => {
            // Every line is checked before the pool is joined: a file with
            // a refused line sends nothing.
            let jobs = jobs_file::read(file, &options)?;
            let node = client::connect(client, pool, options).await?;
            let code = jobs_file::dispatch(&node, &jobs).await;
            client::close(&node).await;
            return Ok(ExitCode::from(code));
        }
        Command::Dispatch { pool, .. }
        | Command::Stop { pool, .. }
        | Command::Notify { pool, .. }
        | Command::Retry { pool, .. }
        | Command::Forget { pool, .. }
        | Command::Shutdown { pool, .. } => pool.clone(),
        Command::Run
        | Command::Check
        | Command::Try { .. }
        | Command::New { .. }
        | Command::Push { .. }
        | Command::Sign { .. }
        | Command::Keygen { .. } => {
            unreachable!("handled above")
        }
    };
    let node = client::connect(client, &pool, options).await?;
    let result = answer(&node, command).await;
    client::close(&node).await;
    finish(result)
}

/// Prints a command's message; its exit code.
fn finish(result: anyhow::Result<(u8, String)>) -> anyhow::Result<ExitCode> {
    let (code, message) = result?;
    if !message.is_empty() {
        println!("{message}");
    }
    Ok(ExitCode::from(code))
}

/// The commands answered from a view of the pool.
async fn read(
    view: &pulse_pool::PoolView,
    command: Command,
    config: &pulse_config::Config,
) -> anyhow::Result<(u8, String)> {
    Ok(match command {
        Command::Status { key, json, .. } => match view.status(&key).await? {
            Some(job) if json => (exit::OK, serde_json::to_string(&job).unwrap_or_default()),
            Some(job) => (exit::OK, client::describe_job(&job)),
            None => (exit::NOT_FOUND_OR_EXISTS, "no such job".into()),
        },
        Command::Jobs { state, prefix, limit, cursor, json, .. } => {
            client::list_jobs(view, state.as_deref(), prefix.unwrap_or_default(), limit, cursor, json).await?
        }
        Command::Workers { json, .. } => {
            client::print_workers(&view.workers().await?, &view.nodes().await?, json);
            (exit::OK, String::new())
        }
        Command::Nodes { json, .. } => {
            client::print_nodes(&view.nodes().await?, json);
            (exit::OK, String::new())
        }
        Command::Rollout { action: RolloutAction::Status, clear: Some(digest), .. } => {
            client::clear_refused(view, &digest).await?
        }
        Command::Rollout { clear: Some(_), .. } => {
            anyhow::bail!("--clear goes with `rollout [status]` alone")
        }
        Command::Rollout { action: RolloutAction::Start, file, version, .. } => {
            let file = file.context("`rollout start` needs --file FILE: the plugin file to announce")?;
            let (digest, path) = pulse_host::registry::release_to_announce(&file, config, view.pool())?;
            client::start_rollout(view, &digest, &path, version.as_deref().unwrap_or_default()).await?
        }
        Command::Rollout { file: Some(_), .. } | Command::Rollout { version: Some(_), .. } => {
            anyhow::bail!("--file and --version go with `rollout start`")
        }
        Command::Rollout { action: RolloutAction::Pause, .. } => {
            client::set_rollout(view, RolloutState::Paused).await?
        }
        Command::Rollout { action: RolloutAction::Resume, .. } => {
            client::set_rollout(view, RolloutState::Running).await?
        }
        Command::Rollout { action: RolloutAction::Undo, .. } => {
            client::set_rollout(view, RolloutState::Undoing).await?
        }
        Command::Rollout { json, .. } => {
            let refused = view.refused_releases().await?;
            let announced = view.rollout().await?;
            let (workers, handler) = (view.workers().await?, view.handler().await?);
            client::print_rollout(&workers, handler.as_deref(), announced.as_ref(), &refused, json);
            (exit::OK, String::new())
        }
        _ => unreachable!("only read-only commands come here"),
    })
}

async fn answer(node: &pulse_pool::Node, command: Command) -> anyhow::Result<(u8, String)> {
    Ok(match command {
        Command::Dispatch { key, payload, payload_file, .. } => {
            let key = key.context("a KEY or --from-file is needed")?;
            let payload = match payload_file {
                Some(file) => {
                    std::fs::read(&file).with_context(|| format!("failed to read {}", file.display()))?
                }
                None => payload.unwrap_or_default().into_bytes(),
            };
            client::dispatch_code(&node.dispatch(&key, &payload).await?)
        }
        Command::Stop { key, .. } => client::event_code(&node.stop(&key).await?, "stopped"),
        Command::Notify { key, payload, .. } => {
            client::event_code(&node.notify(&key, payload.as_bytes()).await?, "notified")
        }
        Command::Retry { key, .. } => match node.retry(&key).await? {
            true => (exit::OK, "queued again from attempt 1".into()),
            false => (exit::NOT_FOUND_OR_EXISTS, "no failed job has this key".into()),
        },
        Command::Forget { key, .. } => match node.forget(&key).await? {
            true => (exit::OK, "forgotten".into()),
            false => (exit::NOT_FOUND_OR_EXISTS, "no failed job has this key".into()),
        },
        Command::Shutdown { timeout, .. } => {
            let jobs = node.shutdown(timeout).await?;
            (exit::OK, format!("shut down; the pool held {jobs} jobs"))
        }
        _ => unreachable!("handled before"),
    })
}

/// A duration as the config file writes them (`"60s"`, `"500ms"`, `"2m"`).
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    pulse_config::units::duration(text).ok_or_else(|| {
        format!("{text:?} is not a duration: write a number and a unit, like 500ms, 60s or 2m")
    })
}
