//! [`JobRunner`]: runs one worker's jobs of one plugin, routing each call to
//! the instance that serves the job's key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::actor::{Actor, Command, Commands, OnGone, Reply, traced_caller};
use crate::error::CallError;
use crate::job::Job;
use crate::outputs::JobOutputs;
use crate::plugin::{Isolation, Plugin};

/// Runs the jobs of one worker with one plugin.
///
/// Calls for one key are served in the order they are made; calls for keys
/// in different instances run concurrently. In [`Isolation::Job`] every job
/// has its own instance, created by `start` and dropped when the job ends; in
/// [`Isolation::Worker`] one instance serves every job.
pub struct JobRunner {
    inner: Arc<RunnerInner>,
}

struct RunnerInner {
    plugin: Plugin,
    outputs: Arc<dyn JobOutputs>,
    /// Which instance serves each running key.
    routes: Mutex<Routes>,
    next_id: AtomicU64,
    tasks: TaskTracker,
}

#[derive(Default)]
struct Routes {
    by_key: HashMap<String, Route>,
    /// The one instance of worker isolation, once created.
    shared: Option<Route>,
}

/// A way into an instance's task.
#[derive(Clone)]
struct Route {
    instance: u64,
    commands: Commands,
}

impl JobRunner {
    pub(crate) fn new(plugin: Plugin, outputs: Arc<dyn JobOutputs>) -> Self {
        Self {
            inner: Arc::new(RunnerInner {
                plugin,
                outputs,
                routes: Mutex::new(Routes::default()),
                next_id: AtomicU64::new(1),
                tasks: TaskTracker::new(),
            }),
        }
    }

    /// Starts `job`. On `Ok` it runs here until stopped, completed or failed.
    ///
    /// # Errors
    /// [`CallError::AlreadyRunning`] when the key runs here; otherwise the
    /// handler's refusal or the trap or limit that ended the call. After any
    /// error the job does not run here.
    ///
    /// # Cancel safety
    /// Not cancel safe: the call runs on the job's instance task whether or
    /// not its answer is awaited.
    pub async fn start(&self, job: Job) -> Result<(), CallError> {
        let key = job.key.clone();
        let route = {
            let mut routes = self.inner.lock();
            if routes.by_key.contains_key(&key) {
                return Err(CallError::AlreadyRunning(key));
            }
            let route = match self.inner.plugin.isolation() {
                Isolation::Job => self.inner.spawn_instance(),
                Isolation::Worker => match &routes.shared {
                    Some(route) if !route.commands.is_closed() => route.clone(),
                    _ => {
                        let route = self.inner.spawn_instance();
                        routes.shared = Some(route.clone());
                        route
                    }
                },
            };
            // Routed before the call, so calls made while it starts queue
            // behind it on the same instance.
            routes.by_key.insert(key.clone(), route.clone());
            route
        };
        let result =
            request(&route, &key, |reply| Command::Start { job, reply, traced: traced_caller() }).await;
        if result.is_err() {
            self.inner.forget(&key, route.instance);
        }
        result
    }

    /// Stops job `key`: calls the handler's `stop`, then drops the job (and
    /// in job isolation its instance) whatever the handler answered.
    ///
    /// # Errors
    /// [`CallError::NotRunning`] when the key does not run here; otherwise
    /// the handler's error, a trap or a limit (the job is stopped anyway).
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`JobRunner::start`]).
    pub async fn stop(&self, key: &str) -> Result<(), CallError> {
        let route = self.inner.route(key)?;
        let result = request(&route, key, |reply| Command::Stop { key: key.to_owned(), reply }).await;
        self.inner.forget(key, route.instance);
        result
    }

    /// Delivers a notification to job `key`.
    ///
    /// # Errors
    /// [`CallError::NotRunning`] when the key does not run here; otherwise
    /// the handler's error, a trap or a limit. When
    /// [`CallError::ends_job`] holds, the job no longer runs.
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`JobRunner::start`]).
    pub async fn notify(&self, key: &str, payload: Vec<u8>) -> Result<(), CallError> {
        let route = self.inner.route(key)?;
        let result = request(&route, key, |reply| Command::Notify {
            key: key.to_owned(),
            payload,
            reply,
            traced: traced_caller(),
        })
        .await;
        if let Err(error) = &result
            && error.ends_job()
        {
            self.inner.forget(key, route.instance);
        }
        result
    }

    /// Drops job `key` without calling into it (no `stop`, no timer from
    /// now on): its host lost it. Calls queued for it before are answered
    /// first. Nothing happens for a key that does not run here.
    ///
    /// # Cancel safety
    /// Cancel safe: the job's instance is dropped either way.
    pub async fn abandon(&self, key: &str) {
        let Ok(route) = self.inner.route(key) else { return };
        let _ = route.commands.send(Box::new(Command::Abandon { key: key.to_owned() })).await;
        self.inner.forget(key, route.instance);
    }

    /// The state job `key` saved last (`host.save-state`), as its instance
    /// keeps it to start the job again after a neighbour's trap; `None`
    /// when it saved none or does not run here. What a host writes back
    /// with the job when Redis lost the pool's data.
    ///
    /// # Cancel safety
    /// Cancel safe: it only asks.
    pub async fn saved_state(&self, key: &str) -> Option<Vec<u8>> {
        let route = self.inner.route(key).ok()?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        route.commands.send(Box::new(Command::SavedState { key: key.to_owned(), reply })).await.ok()?;
        answer.await.ok().flatten()
    }

    /// Whether job `key` runs here.
    pub fn is_running(&self, key: &str) -> bool {
        self.inner.lock().by_key.contains_key(key)
    }

    /// The keys of the jobs running here.
    pub fn running(&self) -> Vec<String> {
        self.inner.lock().by_key.keys().cloned().collect()
    }

    /// Drops every instance without calling the handlers (the jobs' owner
    /// decides what to stop first) and waits for their tasks to end.
    ///
    /// # Cancel safety
    /// Not cancel safe: instances not yet closed when it is dropped are
    /// dropped without waiting.
    pub async fn close(self) {
        {
            let mut routes = self.inner.lock();
            routes.by_key.clear();
            routes.shared = None;
        }
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl std::fmt::Debug for JobRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobRunner")
            .field("plugin", &self.inner.plugin.name())
            .field("running", &self.inner.lock().by_key.len())
            .finish_non_exhaustive()
    }
}

impl RunnerInner {
    fn lock(&self) -> MutexGuard<'_, Routes> {
        // Held for map updates only, never across an await (a std mutex).
        self.routes.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn route(&self, key: &str) -> Result<Route, CallError> {
        self.lock().by_key.get(key).cloned().ok_or_else(|| CallError::NotRunning(key.to_owned()))
    }

    /// Forgets `key` if `instance` still serves it; in job isolation that
    /// drops the last sender, so the instance's task ends.
    fn forget(&self, key: &str, instance: u64) {
        let mut routes = self.lock();
        if routes.by_key.get(key).is_some_and(|route| route.instance == instance) {
            routes.by_key.remove(key);
        }
    }

    fn spawn_instance(self: &Arc<Self>) -> Route {
        let instance = self.next_id.fetch_add(1, Ordering::Relaxed);
        let weak: Weak<RunnerInner> = Arc::downgrade(self);
        let on_gone: OnGone = Arc::new(move |key: &str, instance: u64| {
            if let Some(runner) = weak.upgrade() {
                runner.forget(key, instance);
            }
        });
        let commands =
            Actor::spawn(instance, self.plugin.inner.clone(), self.outputs.clone(), on_gone, &self.tasks);
        Route { instance, commands }
    }
}

/// Sends a command to an instance and waits for its answer.
async fn request(route: &Route, key: &str, command: impl FnOnce(Reply) -> Command) -> Result<(), CallError> {
    let (reply, answer) = oneshot::channel();
    if route.commands.send(Box::new(command(reply))).await.is_err() {
        return Err(CallError::NotRunning(key.to_owned()));
    }
    // The task drops the reply only when it ends mid-call (the runner closed).
    answer.await.unwrap_or_else(|_| Err(CallError::NotRunning(key.to_owned())))
}
