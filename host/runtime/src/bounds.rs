//! The sizes and rates a plugin controls, each with its limit: enforced
//! before the host stores, copies or logs the data. docs/limits.md lists
//! them.
//!
//! - a timer's name: [`MAX_TIMER_NAME`] bytes; timers per job:
//!   [`MAX_TIMERS_PER_JOB`];
//! - an error's text (`job-error`, `producer-error`, a trap's message):
//!   [`MAX_ERROR_TEXT`] bytes, cut with a marker;
//! - a log line (`env.log`, stdout, stderr): [`MAX_LOG_LINE`] bytes, cut
//!   with a marker;
//! - what one job logs: [`LOG_RATE`] bytes a second on average, bursts of
//!   [`LOG_BURST`]; a line costs its length plus [`LOG_LINE_COST`]. Lines
//!   over it are dropped, counted (`pulse_plugin_log_lines_dropped_total`)
//!   and reported in one line when the job may log again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use metrics::Counter;

/// Longest timer name, bytes.
pub const MAX_TIMER_NAME: usize = 256;
/// Timers one job may have armed at once.
pub const MAX_TIMERS_PER_JOB: usize = 64;
/// Longest error text kept, bytes; longer ones are cut.
pub const MAX_ERROR_TEXT: usize = 4096;
/// Longest log line, bytes; longer ones are cut.
pub const MAX_LOG_LINE: usize = 16 * 1024;
/// Log bytes one job may write a second, on average.
pub const LOG_RATE: u64 = 16 * 1024;
/// Log bytes one job may write at once after being quiet.
pub const LOG_BURST: u64 = 256 * 1024;
/// What a line costs besides its text (its record's fields).
pub const LOG_LINE_COST: u64 = 64;

/// `text` cut to at most `max` bytes (at a character boundary), with a
/// marker saying how long it was.
pub(crate) fn cut(text: String, max: usize) -> String {
    if text.len() <= max { text } else { cut_str(&text, max) }
}

/// [`cut`] of a borrowed text: copies only what it keeps.
fn cut_str(text: &str, max: usize) -> String {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} […cut: {} bytes in all]", &text[..end], text.len())
}

/// The log budget of one instance's jobs: what the job whose call runs
/// now may still log. Shared by the `env.log` import, the captured stdout
/// and stderr, and the host's own lines about the job.
pub(crate) struct LogGate {
    state: Mutex<GateState>,
    dropped: Counter,
}

#[derive(Default)]
struct GateState {
    /// The job whose call runs now (the instance's calls are serial).
    current: Option<String>,
    budgets: HashMap<String, Budget>,
}

struct Budget {
    bytes: f64,
    at: Instant,
    dropped: u64,
}

/// Whether a line may be logged.
pub(crate) enum Admit {
    /// Log it; `dropped` lines of the job were dropped before it.
    Yes { dropped: u64 },
    /// Drop it.
    No,
}

impl LogGate {
    /// A gate counting the lines it drops in `dropped`.
    pub(crate) fn new(dropped: Counter) -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(GateState::default()), dropped })
    }

    /// The job whose call runs from now on.
    pub(crate) fn enter(&self, key: &str) {
        let mut state = self.state.lock().expect("log gate lock");
        if state.current.as_deref() != Some(key) {
            state.current = Some(key.to_owned());
        }
    }

    /// Whether a line of `len` bytes of the current call's job may be
    /// logged now.
    pub(crate) fn admit_current(&self, len: usize) -> Admit {
        let mut state = self.state.lock().expect("log gate lock");
        let GateState { current, budgets } = &mut *state;
        self.admit_in(budgets, current.as_deref().unwrap_or(""), len)
    }

    /// Whether a line of `len` bytes about job `key` may be logged now.
    pub(crate) fn admit(&self, key: &str, len: usize) -> Admit {
        let mut state = self.state.lock().expect("log gate lock");
        self.admit_in(&mut state.budgets, key, len)
    }

    fn admit_in(&self, budgets: &mut HashMap<String, Budget>, key: &str, len: usize) -> Admit {
        let now = Instant::now();
        if !budgets.contains_key(key) {
            if budgets.len() > 4096 {
                // Jobs long gone, or quiet long enough to have a full budget.
                budgets.retain(|_, b| b.dropped > 0 && now.duration_since(b.at).as_secs() < 60);
            }
            budgets.insert(key.to_owned(), Budget { bytes: LOG_BURST as f64, at: now, dropped: 0 });
        }
        let budget = budgets.get_mut(key).expect("inserted above");
        let refill = now.duration_since(budget.at).as_secs_f64() * LOG_RATE as f64;
        budget.bytes = (budget.bytes + refill).min(LOG_BURST as f64);
        budget.at = now;
        let cost = (len.min(MAX_LOG_LINE) as u64 + LOG_LINE_COST) as f64;
        if budget.bytes < cost {
            budget.dropped += 1;
            self.dropped.increment(1);
            return Admit::No;
        }
        budget.bytes -= cost;
        Admit::Yes { dropped: std::mem::take(&mut budget.dropped) }
    }
}

/// Logs one line through `gate` (as the current call's job when `key` is
/// none): cut to [`MAX_LOG_LINE`], dropped when over the job's rate, after
/// a line saying how many were dropped before it.
pub(crate) fn gated(gate: &LogGate, key: Option<&str>, text: &str, log: impl FnOnce(&str)) {
    let admit = match key {
        Some(key) => gate.admit(key, text.len()),
        None => gate.admit_current(text.len()),
    };
    match admit {
        Admit::No => {}
        Admit::Yes { dropped } => {
            if dropped > 0 {
                tracing::warn!(
                    target: "pulse_runtime::guest",
                    dropped,
                    "{dropped} log line(s) of this job were dropped: over {LOG_RATE} bytes a second"
                );
            }
            if text.len() > MAX_LOG_LINE {
                log(&cut_str(text, MAX_LOG_LINE));
            } else {
                log(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_at_a_character_with_a_marker() {
        assert_eq!(cut("short".into(), 10), "short");
        let cut_text = cut("ééééé".into(), 5);
        assert_eq!(cut_text, "éé […cut: 10 bytes in all]");
    }

    #[test]
    fn a_job_over_its_rate_is_dropped_and_counted_then_reported() {
        let gate = LogGate::new(Counter::noop());
        gate.enter("a");
        let line = 16 * 1024 - LOG_LINE_COST as usize;
        let admitted = (0..40).filter(|_| matches!(gate.admit_current(line), Admit::Yes { .. })).count();
        // The burst and what refilled while the loop ran; never all 40.
        assert!((16..20).contains(&admitted), "{admitted}");
        // Another job has its own budget.
        assert!(matches!(gate.admit("b", 100), Admit::Yes { dropped: 0 }));
        // Once refilled, the next line of `a` says how many were dropped.
        gate.state.lock().unwrap().budgets.get_mut("a").unwrap().bytes = LOG_BURST as f64;
        match gate.admit_current(10) {
            Admit::Yes { dropped } => assert_eq!(dropped, 40 - admitted as u64),
            Admit::No => panic!("a refilled budget must admit"),
        }
    }
}
