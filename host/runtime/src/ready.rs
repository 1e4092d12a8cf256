//! Instances made ahead of need: in job isolation a start takes one that is
//! ready instead of instantiating on its way.
//!
//! A new instance in a slot of the pool no instance has used costs more
//! than its guest's `start` (the store, the component's instance, their
//! first pages). A plugin's [`Ready`] keeps a few instances made by a
//! task of its own, so that this work is done beside the jobs' path, not
//! on it. How many: about one per thousand starts a second in the last
//! second or the current one, at least one, at most
//! `runtime.ready_instances` (8 by default; 0 keeps none); none once the
//! plugin has started nothing for [`IDLE`] (the task drops them and ends;
//! the next start begins it again).
//!
//! A ready instance counts against its plugin's quota and the runtime's
//! `max_instances` like any other. A start of the same plugin takes it, so
//! it never stands in that plugin's way; a start of another plugin refused
//! for room drops every plugin's ready instances and tries once more
//! ([`Registry::hold`]).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};

use crate::instance::Instance;
use crate::outputs::{JobOutputs, NoJobs};
use crate::plugin::PluginInner;

/// Starts a second that one more ready instance is kept for.
const STARTS_PER_READY: u32 = 1_000;

/// How long a plugin keeps ready instances without a start.
pub(crate) const IDLE: Duration = Duration::from_secs(10);

/// A plugin's instances made ahead of need, as [`crate::Plugin::ready_instances`]
/// tells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyInstances {
    /// Ready now.
    pub ready: usize,
    /// Taken by starts so far.
    pub taken: u64,
}

/// One plugin's ready instances.
pub(crate) struct Ready {
    /// The most it keeps (`runtime.ready_instances`; 0: none).
    most: usize,
    state: Mutex<State>,
    /// Told at each start, so the task makes another.
    started: Arc<Notify>,
    /// Held by the task while it makes an instance.
    making: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct State {
    instances: Vec<Instance>,
    /// Whether the task that makes them runs.
    filling: bool,
    /// Starts in the current second and in the one before.
    window: Option<Instant>,
    this_second: u32,
    last_second: u32,
    /// Starts that took a ready instance.
    taken: u64,
}

impl State {
    fn count_start(&mut self, now: Instant) {
        match self.window {
            Some(began) if now.duration_since(began) < Duration::from_secs(1) => {}
            Some(began) if now.duration_since(began) < Duration::from_secs(2) => {
                self.last_second = self.this_second;
                self.this_second = 0;
                self.window = Some(began + Duration::from_secs(1));
            }
            _ => {
                (self.last_second, self.this_second) = (0, 0);
                self.window = Some(now);
            }
        }
        self.this_second = self.this_second.saturating_add(1);
    }

    /// How many instances to keep ready now, of at most `most`.
    fn target(&self, most: usize) -> usize {
        let rate = self.this_second.max(self.last_second);
        usize::try_from(rate.div_ceil(STARTS_PER_READY)).unwrap_or(most).max(1).min(most)
    }
}

impl Ready {
    pub(crate) fn new(most: u32) -> Self {
        Self {
            most: usize::try_from(most).unwrap_or(usize::MAX),
            state: Mutex::default(),
            started: Arc::default(),
            making: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Held for a few field updates, never across an await.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn counts(&self) -> ReadyInstances {
        let state = self.lock();
        ReadyInstances { ready: state.instances.len(), taken: state.taken }
    }

    /// Drops every ready instance (their quota and slots are free again);
    /// whether there were any.
    pub(crate) fn clear(&self) -> bool {
        let dropped = std::mem::take(&mut self.lock().instances);
        !dropped.is_empty()
    }
}

/// Takes a ready instance of `plugin`, bound to `outputs` and
/// `commands`; `None` when none is ready (the caller instantiates, then
/// calls [`started`]).
pub(crate) fn take(
    plugin: &PluginInner,
    outputs: &Arc<dyn JobOutputs>,
    commands: &crate::actor::WeakCommands,
) -> Option<Instance> {
    let instance = {
        let mut state = plugin.ready.lock();
        state.count_start(Instant::now());
        let instance = state.instances.pop();
        state.taken += u64::from(instance.is_some());
        instance
    };
    let mut instance = instance?;
    instance.bind(outputs.clone(), commands.clone());
    Some(instance)
}

/// A start of `plugin` has its instance: the plugin's task makes the
/// next (after it, so that the two do not compete for the last room).
pub(crate) fn started(plugin: &Arc<PluginInner>) {
    if plugin.ready.most == 0 {
        return;
    }
    let start_task = {
        let mut state = plugin.ready.lock();
        !std::mem::replace(&mut state.filling, true)
    };
    if start_task {
        tokio::spawn(fill(Arc::downgrade(plugin)));
    } else {
        plugin.ready.started.notify_one();
    }
}

/// The task that keeps `plugin`'s instances ready, until it is idle for
/// [`IDLE`] or dropped.
async fn fill(plugin: Weak<PluginInner>) {
    loop {
        {
            let Some(plugin) = plugin.upgrade() else { return };
            loop {
                let wanted = {
                    let state = plugin.ready.lock();
                    state.instances.len() < state.target(plugin.ready.most)
                };
                if !wanted {
                    break;
                }
                // Held until the instance is kept: a start refused for room
                // waits for it, then drops it (`Registry::hold`).
                let _making = plugin.ready.making.lock().await;
                // Bound to nothing until a start takes it: no job runs in it.
                let (commands, _) = mpsc::channel(1);
                match Instance::new(&plugin, Arc::new(NoJobs), commands.downgrade()).await {
                    Ok(instance) => plugin.ready.lock().instances.push(instance),
                    // Quota or pool full: starts instantiate (and are refused
                    // or not) as without ready instances; try again after the
                    // next start.
                    Err(_) => break,
                }
            }
        }
        // Only the bell is held while waiting: a plugin dropped meanwhile
        // (a reload removed it) drops its ready instances at once.
        let Some(started) = plugin.upgrade().map(|plugin| plugin.ready.started.clone()) else { return };
        if tokio::time::timeout(IDLE, started.notified()).await.is_err() {
            let Some(plugin) = plugin.upgrade() else { return };
            let idle = {
                let mut state = plugin.ready.lock();
                state.filling = false;
                std::mem::take(&mut state.instances)
            };
            drop(idle);
            return;
        }
    }
}

/// Every plugin's ready instances of one runtime, so that a start refused
/// for room can free theirs.
#[derive(Default)]
pub(crate) struct Registry(Mutex<Vec<Weak<Ready>>>);

impl Registry {
    pub(crate) fn add(&self, ready: &Arc<Ready>) {
        let mut all = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        all.retain(|ready| ready.strong_count() > 0);
        all.push(Arc::downgrade(ready));
    }

    /// Waits for instances being made ahead of need, and keeps more from
    /// being made until the answer is dropped: then
    /// [`Held::drain`] frees their room for a start.
    pub(crate) async fn hold(&self) -> Held {
        let all: Vec<Arc<Ready>> = {
            let all = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            all.iter().filter_map(Weak::upgrade).collect()
        };
        let mut held = Vec::with_capacity(all.len());
        // Always in the registry's order: two holders never wait on each other.
        for ready in all {
            let guard = ready.making.clone().lock_owned().await;
            held.push((ready, guard));
        }
        Held(held)
    }
}

/// Every plugin's ready instances, none being made meanwhile.
pub(crate) struct Held(Vec<(Arc<Ready>, tokio::sync::OwnedMutexGuard<()>)>);

impl Held {
    /// Drops every plugin's ready instances; whether there were any.
    pub(crate) fn drain(&self) -> bool {
        self.0.iter().fold(false, |dropped, (ready, _)| ready.clear() | dropped)
    }
}
