//! What can go wrong when loading a plugin or calling it.

use std::path::PathBuf;
use std::time::Duration;

/// A plugin refused at load: the message names the plugin and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("failed to read plugin {plugin:?} from {}", path.display())]
    Read {
        /// The plugin's name.
        plugin: String,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not WebAssembly at all.
    #[error("plugin {plugin:?} is not WebAssembly: it does not start with `\\0asm`")]
    NotWasm {
        /// The plugin's name.
        plugin: String,
    },
    /// A core module instead of a component.
    #[error(
        "plugin {plugin:?} is a core WebAssembly module, not a component: build it for \
         `wasm32-wasip2` (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule {
        /// The plugin's name.
        plugin: String,
    },
    /// The component is malformed or uses features the engine lacks.
    #[error("plugin {plugin:?} failed to compile: {message}")]
    Compile {
        /// The plugin's name.
        plugin: String,
        /// The compiler's explanation.
        message: String,
    },
    /// The options do not fit the runtime (a limit above its ceiling).
    #[error("plugin {plugin:?} has invalid options: {message}")]
    InvalidOptions {
        /// The plugin's name.
        plugin: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// The component does not implement `pulse:job/job-handler`: an export is
    /// missing or has the wrong type, or it imports something the host does
    /// not provide.
    #[error("plugin {plugin:?} does not implement the `pulse:job/{world}` world: {message}")]
    WrongWorld {
        /// The plugin's name.
        plugin: String,
        /// The world it was loaded as: `job-handler` or `job-producer`.
        world: &'static str,
        /// Which item is missing, mismatched or unsatisfiable.
        message: String,
    },
}

/// The engine could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A setting is out of range; the message names it and what is allowed.
    #[error("invalid runtime configuration: {0}")]
    Invalid(String),
    /// wasmtime refused the configuration.
    #[error("failed to create the WebAssembly engine: {0}")]
    Engine(String),
}

/// An expected failure a handler reported: the `job-error` of the WIT
/// contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The input can never succeed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The call may succeed later.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The job cannot go on.
    #[error("fatal: {0}")]
    Fatal(String),
}

/// Why a call into a plugin did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The handler returned an error (see [`JobError`]).
    #[error("the handler returned an error: {0}")]
    Guest(JobError),
    /// The instance trapped: a panic, an `unreachable`, an invalid memory
    /// access. The message is wasmtime's, with the guest backtrace.
    #[error("the plugin trapped: {0}")]
    Trap(String),
    /// The call ran longer than the plugin's `call_timeout`.
    #[error("the call did not return within {0:?}")]
    Timeout(Duration),
    /// The instance tried to grow its memory beyond its limit.
    #[error("the plugin exceeded its memory limit of {limit} bytes")]
    MemoryLimit {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The call used up its fuel budget.
    #[error("the call used up its fuel budget of {0}")]
    FuelExhausted(u64),
    /// The runtime could not create an instance (for example the pooling
    /// allocator is full).
    #[error("failed to instantiate the plugin: {0}")]
    Instantiate(String),
    /// `start` for a key that already runs on this runner.
    #[error("job {0:?} is already running here")]
    AlreadyRunning(String),
    /// A call for a key that does not run on this runner.
    #[error("job {0:?} is not running here")]
    NotRunning(String),
    /// The host refused to run the job's code: it may run elsewhere now
    /// ([`crate::JobOutputs::may_run`] answered false).
    #[error("job {0:?} may run elsewhere now; its code was not called")]
    Fenced(String),
    /// The caller stopped waiting for the call (its host gave up on a
    /// `stop` that outlasted `shutdown_timeout`, say): the guest was cut
    /// off mid-call, and its instance discarded, rather than left to run
    /// until `call_timeout`.
    #[error("the call to job {0:?} was cut off: its caller stopped waiting for it")]
    Abandoned(String),
    /// The job was lost during the call ([`crate::JobOutputs::lost`]: its
    /// worker's lease may have ended, so it may run elsewhere now): the
    /// guest was cut off mid-call and its instance discarded, so a call
    /// never outlives the lease it started under.
    #[error("the call to job {0:?} was cut off: the job may run elsewhere now")]
    Lost(String),
}

impl CallError {
    /// Whether the job this call was for has ended because of it. After
    /// `start` any error means the job is not running; after `notify` a
    /// `fatal` error, a trap or an exhausted limit ends the job, while
    /// `invalid-input` and `retryable` leave it running.
    pub fn ends_job(&self) -> bool {
        !matches!(
            self,
            CallError::Guest(JobError::InvalidInput(_) | JobError::Retryable(_))
                | CallError::AlreadyRunning(_)
        )
    }

    /// Whether the instance that made the call is unusable afterwards and
    /// was discarded (its memory may be inconsistent).
    pub fn poisons_instance(&self) -> bool {
        matches!(
            self,
            CallError::Trap(_)
                | CallError::Timeout(_)
                | CallError::Abandoned(_)
                | CallError::Lost(_)
                | CallError::MemoryLimit { .. }
                | CallError::FuelExhausted(_)
        )
    }
}

/// Why the host refused a request from a handler: the `host-error` of the
/// WIT contract, returned by [`crate::JobOutputs`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostRefusal {
    /// The job is not running on this worker.
    #[error("the job is not owned by this worker")]
    NotOwned,
    /// A size or count limit; the message names it.
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// Not possible now; may succeed later.
    #[error("unavailable: {0}")]
    Unavailable(String),
}
