//! The data every store carries, and the host functions it serves.
//!
//! # Layout
//! - this file: [`HostState`]: WASI and wasi:http contexts, limits, the
//!   jobs the instance runs (what makes a request "owned"), their timers.
//! - `imports`: the `host` interface of the WIT contract.
//! - `stdio`: guest stdout and stderr into the log.

mod imports;
pub(crate) mod stdio;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::actor::{Command, WeakCommands};
use crate::bounds::LogGate;
use crate::job::Job;
use crate::limits::Limiter;
use crate::outbound::OutboundHooks;
use crate::outputs::JobOutputs;

/// What a store holds besides the guest.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    settings: Arc<BTreeMap<String, String>>,
    pub(crate) outputs: Arc<dyn JobOutputs>,
    /// The jobs this instance runs, with what a restart needs.
    pub(crate) jobs: HashMap<String, JobSlot>,
    /// Keys that completed during the current call; the instance reports
    /// them once the call returns.
    pub(crate) completed: Vec<String>,
    /// Where timers deliver their ticks; weak, so armed timers do not keep
    /// an instance alive that nobody can call any more.
    commands: WeakCommands,
    next_generation: u64,
    /// What the jobs of this instance may still log.
    pub(crate) log_gate: Arc<LogGate>,
    http: WasiHttpCtx,
    /// How its outgoing HTTP requests are checked and sent.
    pub(crate) http_hooks: OutboundHooks,
}

/// A job running in an instance.
pub(crate) struct JobSlot {
    /// The job as started, with `state` kept current by `save-state`: what a
    /// restart of the job in a new instance starts from.
    pub(crate) job: Job,
    timers: HashMap<String, Timer>,
}

impl JobSlot {
    pub(crate) fn new(job: Job) -> Self {
        Self { job, timers: HashMap::new() }
    }

    /// Whether the timer `name` is armed with `generation` (a tick of a
    /// replaced or cancelled timer may still be queued). A one-shot timer is
    /// disarmed by the tick that matches.
    pub(crate) fn take_tick(&mut self, name: &str, generation: u64) -> bool {
        match self.timers.get(name) {
            Some(timer) if timer.generation == generation => {
                if !timer.repeat {
                    self.timers.remove(name);
                }
                true
            }
            _ => false,
        }
    }
}

/// An armed timer: the task that sends its ticks, aborted when dropped.
struct Timer {
    generation: u64,
    repeat: bool,
    task: AbortHandle,
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostState {
    pub(crate) fn new(
        limiter: Limiter,
        settings: Arc<BTreeMap<String, String>>,
        outputs: Arc<dyn JobOutputs>,
        commands: WeakCommands,
        log_gate: Arc<LogGate>,
        http_hooks: OutboundHooks,
    ) -> Self {
        // No preopened folders, environment, arguments or network: clocks,
        // random numbers and the captured stdio are all a plugin gets.
        let wasi = WasiCtx::builder()
            .stdout(stdio::LogOutput(stdio::Stdio::Stdout, log_gate.clone()))
            .stderr(stdio::LogOutput(stdio::Stdio::Stderr, log_gate.clone()))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter,
            settings,
            outputs,
            jobs: HashMap::new(),
            completed: Vec::new(),
            commands,
            next_generation: 0,
            log_gate,
            http: WasiHttpCtx::new(),
            http_hooks,
        }
    }

    /// See [`crate::Instance::bind`].
    pub(crate) fn bind(&mut self, outputs: Arc<dyn JobOutputs>, commands: WeakCommands) {
        self.http_hooks.bind(outputs.clone());
        self.outputs = outputs;
        self.commands = commands;
    }

    /// Arms (or re-arms) timer `name` of job `key`; the caller checked that
    /// the job runs here.
    fn arm_timer(&mut self, key: &str, name: &str, delay: Duration, repeat: bool) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let commands = self.commands.clone();
        let (tick_key, tick_name) = (key.to_owned(), name.to_owned());
        // Owned by the job's timer table: aborted when the timer is
        // replaced or cancelled, or the job stops, or the instance is dropped.
        let task = tokio::spawn(async move {
            let mut next = tokio::time::Instant::now() + delay;
            loop {
                tokio::time::sleep_until(next).await;
                let Some(commands) = commands.upgrade() else { return };
                let tick = Box::new(Command::Timer {
                    key: tick_key.clone(),
                    name: tick_name.clone(),
                    generation,
                    due: next,
                });
                if commands.send(tick).await.is_err() || !repeat {
                    return;
                }
                // A slow job skips ticks rather than receiving a burst.
                next = (next + delay).max(tokio::time::Instant::now());
            }
        });
        if let Some(slot) = self.jobs.get_mut(key) {
            slot.timers.insert(name.to_owned(), Timer { generation, repeat, task: task.abort_handle() });
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.http_hooks }
    }
}
