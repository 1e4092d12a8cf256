//! Waiting between reconnection attempts.

use std::time::Duration;

/// First wait after a failure (25–75 ms with jitter); doubled per failure
/// up to [`MAX`] while Redis stays unreachable. Short: a reader that is not
/// reading falls behind.
const FIRST: Duration = Duration::from_millis(50);
/// Longest wait.
const MAX: Duration = Duration::from_secs(2);

/// Exponential backoff with jitter.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self { next: FIRST }
    }

    /// The next wait: jittered, so many clients do not retry in step.
    pub(crate) fn next(&mut self) -> Duration {
        let wait = self.next.mul_f64(0.5 + fastrand::f64());
        self.next = (self.next * 2).min(MAX);
        wait
    }

    pub(crate) fn reset(&mut self) {
        self.next = FIRST;
    }

    /// Sleeps for the next wait, unless `token` is cancelled first; returns
    /// whether the caller should go on.
    pub(crate) async fn wait(&mut self, token: &tokio_util::sync::CancellationToken) -> bool {
        let wait = self.next();
        tokio::select! {
            biased;
            () = token.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }
}
