//! Statistics and the `RESULT` line format.

use std::fmt::Write as _;
use std::time::Duration;

/// A `RESULT` line under construction.
pub struct Result {
    line: String,
}

impl Result {
    /// Starts the line of `scenario`.
    pub fn new(scenario: &str) -> Self {
        Self { line: format!("RESULT scenario={scenario}") }
    }

    /// Adds `key=value`.
    pub fn field(mut self, key: &str, value: impl std::fmt::Display) -> Self {
        let _ = write!(self.line, " {key}={value}");
        self
    }

    /// Adds a duration in microseconds, two decimals.
    pub fn micros(self, key: &str, value: Duration) -> Self {
        self.field(key, format!("{:.2}", value.as_secs_f64() * 1e6))
    }

    /// Adds a duration in milliseconds, two decimals.
    pub fn millis(self, key: &str, value: Duration) -> Self {
        self.field(key, format!("{:.2}", value.as_secs_f64() * 1e3))
    }

    /// Prints the line.
    pub fn print(self) {
        println!("{}", self.line);
    }
}

/// The `p`-th percentile (0–100) of `samples`, nearest rank.
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// Resident memory of this process, in bytes (`VmRSS` of `/proc/self/status`).
pub fn resident_bytes() -> u64 {
    resident_bytes_of("self")
}

/// Resident memory of process `pid` (a number, or `self`), in bytes
/// (`VmRSS` of `/proc/PID/status`); 0 when it cannot be read.
pub fn resident_bytes_of(pid: &str) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// `bytes` in whole MiB, as a field's value.
pub fn mib(bytes: u64) -> String {
    format!("{:.0}", bytes as f64 / f64::from(1 << 20))
}

/// The part of [`resident_bytes_of`] that is the process's own
/// (`RssAnon`): without pages mapped from files and shared memory, such
/// as a plugin's initial memory image mapped copy-on-write into each of
/// its instances, which count once per mapping in `VmRSS` but take memory
/// once.
pub fn anonymous_bytes_of(pid: &str) -> u64 {
    status_bytes(pid, "RssAnon:")
}

/// CPU time process `pid` (a number, or `self`) has used so far, user and
/// system over all its threads, in µs (`utime` + `stime` of
/// `/proc/PID/stat`, in the kernel's fixed 100 ticks a second, so to 10
/// ms); 0 when it cannot be read.
pub fn cpu_us_of(pid: &str) -> u64 {
    cpu_us_in(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// [`cpu_us_of`] from the text of a `/proc/PID/stat`.
fn cpu_us_in(stat: &str) -> u64 {
    // The command name, in parentheses, may hold spaces and parentheses:
    // count the fields after the last `)`.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |at: usize| fields.get(at).and_then(|field| field.parse::<u64>().ok()).unwrap_or(0);
    // After the name: state (field 3), … utime (14), stime (15).
    (ticks(11) + ticks(12)) * 10_000
}

/// A `kB` line of `/proc/PID/status`, in bytes; 0 when it cannot be read.
fn status_bytes(pid: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_is_utime_and_stime_counted_after_the_command_name() {
        // pid, name (with a space and a parenthesis), state, then fields 4
        // to 13, utime 250 and stime 30 ticks, and more.
        let stat = "4242 (serve (host) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 30 0 0 20 0 9";
        assert_eq!(super::cpu_us_in(stat), 280 * 10_000);
        assert_eq!(super::cpu_us_in(""), 0);
    }
}
