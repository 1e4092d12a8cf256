//! What Redis executed during one line of the scenario, from `INFO
//! commandstats` (Lua-internal calls included): the totals of the line's
//! `RESULT`, and a `dispatch-redis` line with each command's share, so
//! that where Redis spends a job's time is one command away. The line
//! also gives the CPU the Redis process used per job (`INFO cpu`, user
//! and system): the commands' own times are wall-clock times, which grow
//! when the machine is busy, and leave out reading, parsing and replying.

use std::collections::BTreeMap;

use crate::report;

/// Per command: (calls, CPU µs) so far; and the CPU µs the Redis process
/// used so far.
pub(super) struct Commandstats(BTreeMap<String, (u64, u64)>, u64);

/// Commands that took less CPU per job than this (µs) are left out of the
/// `dispatch-redis` line (membership upkeep, the bench's own `INFO`); a
/// batch's scripts, a few per thousand jobs, are not.
const LEAST_US_PER_JOB: f64 = 0.05;

impl Commandstats {
    pub(super) async fn read(conn: &mut pulse_redis::Shared) -> redis::RedisResult<Self> {
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
        let field = |line: &str, name: &str| -> u64 {
            line.split(name).nth(1).and_then(|rest| rest.split(',').next()?.parse().ok()).unwrap_or(0)
        };
        let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        let seconds = |name: &str| -> f64 {
            cpu.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let process_us = ((seconds("used_cpu_user") + seconds("used_cpu_sys")) * 1e6) as u64;
        Ok(Self(
            info.lines()
                .filter_map(|line| {
                    let (name, _) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                    Some((name.to_owned(), (field(line, "calls="), field(line, "usec="))))
                })
                .collect(),
            process_us,
        ))
    }

    /// (calls, CPU µs) of each command since `before`, busiest first.
    fn since(&self, before: &Self) -> Vec<(String, u64, u64)> {
        let mut spent: Vec<(String, u64, u64)> = self
            .0
            .iter()
            .map(|(name, &(calls, usec))| {
                let (calls_before, usec_before) = before.0.get(name).copied().unwrap_or_default();
                (name.clone(), calls.saturating_sub(calls_before), usec.saturating_sub(usec_before))
            })
            .filter(|(_, calls, _)| *calls > 0)
            .collect();
        spent.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        spent
    }

    /// (executed commands, their CPU µs) since `before`.
    pub(super) fn total_since(&self, before: &Self) -> (u64, u64) {
        self.since(before).iter().fold((0, 0), |(calls, usec), (_, c, u)| (calls + c, usec + u))
    }

    /// Prints the `dispatch-redis` line of `jobs` jobs: the Redis
    /// process's CPU µs per job (`process_cpu_us_per_job`), then per
    /// command, calls and µs per job (`evalsha_per_job`,
    /// `evalsha_us_per_job`; a subcommand's `|` becomes `_`). A script's
    /// time includes the commands it calls, which are listed too.
    pub(super) fn print_by_command(&self, before: &Self, handler: &str, dispatchers: usize, jobs: usize) {
        let mut line = report::Result::new("dispatch-redis")
            .field("handler", handler)
            .field("dispatchers", dispatchers)
            .field("jobs", jobs)
            .field(
                "process_cpu_us_per_job",
                format!("{:.1}", self.1.saturating_sub(before.1) as f64 / jobs as f64),
            );
        for (name, calls, usec) in self.since(before) {
            let (per_job, us_per_job) = (calls as f64 / jobs as f64, usec as f64 / jobs as f64);
            if us_per_job < LEAST_US_PER_JOB {
                continue;
            }
            let name = name.replace('|', "_");
            line = line
                .field(&format!("{name}_per_job"), format!("{per_job:.3}"))
                .field(&format!("{name}_us_per_job"), format!("{us_per_job:.2}"));
        }
        line.print();
    }
}
