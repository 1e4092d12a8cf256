//! [`Jobs`]: what each job of an instance keeps between calls.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The running jobs of an instance, by key, each with a `T`: put it in a
/// `static` (`static JOBS: Jobs<Count> = Jobs::new();`). An instance runs
/// one call at a time; the mutex only makes the static safe to share.
pub struct Jobs<T>(Mutex<BTreeMap<String, T>>);

impl<T> Jobs<T> {
    /// No jobs.
    #[must_use]
    pub const fn new() -> Self {
        Self(Mutex::new(BTreeMap::new()))
    }

    /// The map itself, for anything the methods below do not do.
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, T>> {
        // A poisoned lock means a panic, which trapped the instance already.
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Keeps `value` for job `key`.
    pub fn insert(&self, key: &str, value: T) {
        self.lock().insert(key.to_owned(), value);
    }

    /// Forgets job `key`; what it kept.
    pub fn remove(&self, key: &str) -> Option<T> {
        self.lock().remove(key)
    }

    /// Runs `f` on what job `key` keeps; `None` when it keeps nothing.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.lock().get_mut(key).map(f)
    }
}

impl<T> Default for Jobs<T> {
    fn default() -> Self {
        Self::new()
    }
}
