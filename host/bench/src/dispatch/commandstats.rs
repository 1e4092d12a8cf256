//! What Redis executed during one line of the scenario, from `INFO
//! commandstats` (Lua-internal calls included): the totals of the line's
//! `RESULT`, and a `dispatch-redis` line with each command's share, so
//! that where Redis spends a job's time is one command away. The line
//! also gives the CPU the Redis process used per job (`INFO cpu`, user
//! and system): the commands' own times are wall-clock times, which grow
//! when the machine is busy, and leave out reading, parsing and replying.
//! The system share is given apart: it is the sockets' reads and writes,
//! waking the clients and Redis's own sleeps between bursts, and it grows
//! per job when a line keeps Redis less busy (fewer commands to each
//! wake-up), whatever each job's commands cost.

use std::collections::BTreeMap;

use crate::report;

/// Per command: (calls, CPU µs) so far; the CPU µs the Redis process
/// used so far, in all and in the kernel; the errors it answered so far
/// (`INFO errorstats`: a `CROSSSLOT` or a script's "non local key" on a
/// cluster counts).
pub(super) struct Commandstats(BTreeMap<String, (u64, u64)>, u64, u64, u64);

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
        let system_us = (seconds("used_cpu_sys") * 1e6) as u64;
        let errorstats: String = redis::cmd("INFO").arg("errorstats").query_async(conn).await?;
        let errors = errorstats
            .lines()
            .filter(|line| line.starts_with("errorstat_"))
            .map(|line| field(line, "count="))
            .sum();
        Ok(Self(
            info.lines()
                .filter_map(|line| {
                    let (name, _) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                    Some((name.to_owned(), (field(line, "calls="), field(line, "usec="))))
                })
                .collect(),
            process_us,
            system_us,
            errors,
        ))
    }

    /// The figures of several servers (a cluster's masters) added up.
    pub(super) fn sum(all: Vec<Self>) -> Self {
        let mut total = Self(BTreeMap::new(), 0, 0, 0);
        for stats in all {
            for (name, (calls, usec)) in stats.0 {
                let entry = total.0.entry(name).or_default();
                entry.0 += calls;
                entry.1 += usec;
            }
            total.1 += stats.1;
            total.2 += stats.2;
            total.3 += stats.3;
        }
        total
    }

    /// CPU µs the Redis process used since `before`.
    pub(super) fn process_us_since(&self, before: &Self) -> u64 {
        self.1.saturating_sub(before.1)
    }

    /// CPU µs the Redis process used in the kernel since `before`.
    pub(super) fn system_us_since(&self, before: &Self) -> u64 {
        self.2.saturating_sub(before.2)
    }

    /// Errors Redis answered since `before`.
    pub(super) fn errors_since(&self, before: &Self) -> u64 {
        self.3.saturating_sub(before.3)
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
            )
            .field(
                "process_sys_us_per_job",
                format!("{:.1}", self.system_us_since(before) as f64 / jobs as f64),
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

/// What a line is measured on: the Redis servers (the one server, or each
/// master of a cluster, read directly: `INFO` through a cluster
/// connection would not say which node answered), and the two processes
/// on this machine beside them, this one (the dispatching node, or the
/// HTTP client) and the one its workers run in (the no-op workers, or the
/// host with its API).
pub(super) struct Servers {
    redis: Vec<pulse_redis::Shared>,
    workers: u32,
}

/// The figures so far: each server's, and the CPU µs this process and the
/// workers' process used.
pub(super) struct Reading {
    redis: Vec<Commandstats>,
    client_us: u64,
    workers_us: u64,
}

impl Servers {
    /// The servers at `urls` (single-server URLs), and the workers'
    /// process `workers`.
    pub(super) async fn open(urls: &[String], workers: u32) -> Result<Self, Box<dyn std::error::Error>> {
        let mut redis = Vec::new();
        for url in urls {
            redis.push(pulse_redis::Redis::open(url.as_str())?.shared().await?);
        }
        Ok(Self { redis, workers })
    }

    /// Each server's figures so far, and the two processes' CPU.
    pub(super) async fn read(&mut self) -> redis::RedisResult<Reading> {
        let mut all = Vec::with_capacity(self.redis.len());
        for conn in &mut self.redis {
            all.push(Commandstats::read(conn).await?);
        }
        Ok(Reading {
            redis: all,
            client_us: report::cpu_us_of("self"),
            workers_us: report::cpu_us_of(&self.workers.to_string()),
        })
    }
}

/// What the servers spent on one line, from their figures before and
/// after it.
pub(super) struct Spent {
    pub(super) before: Commandstats,
    pub(super) after: Commandstats,
    /// Servers measured.
    pub(super) servers: usize,
    /// The busiest server's share of the CPU all of them used.
    pub(super) busiest_share: f64,
    /// CPU µs this process and the workers' process used.
    client_us: u64,
    workers_us: u64,
}

impl Spent {
    pub(super) fn new(before: Reading, after: Reading) -> Self {
        let client_us = after.client_us.saturating_sub(before.client_us);
        let workers_us = after.workers_us.saturating_sub(before.workers_us);
        let (before, after) = (before.redis, after.redis);
        let used: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a.process_us_since(b)).collect();
        let total: u64 = used.iter().sum();
        let busiest = used.iter().copied().max().unwrap_or(0);
        Self {
            servers: used.len(),
            busiest_share: if total == 0 { 0.0 } else { busiest as f64 / total as f64 },
            before: Commandstats::sum(before),
            after: Commandstats::sum(after),
            client_us,
            workers_us,
        }
    }

    /// The fields every line shows of it, per job of `jobs`: commands, their
    /// CPU, the Redis processes' CPU (summed over servers) in all and in
    /// the kernel, servers, the busiest one's share, errors answered; the
    /// CPU of this process (`client_cpu_us_per_job`: the dispatching node,
    /// or the HTTP client) and of the workers' process
    /// (`workers_cpu_us_per_job`: the no-op workers, or the host with its
    /// API and the dispatching node behind it), to 10 ms a line.
    pub(super) fn fields(&self, line: report::Result, jobs: usize) -> report::Result {
        let (calls, usec) = self.after.total_since(&self.before);
        let per_job = |value: u64| value as f64 / jobs as f64;
        line.field("cmds_per_job", format!("{:.2}", per_job(calls)))
            .field("redis_cpu_us_per_job", format!("{:.1}", per_job(usec)))
            .field(
                "process_cpu_us_per_job",
                format!("{:.1}", per_job(self.after.process_us_since(&self.before))),
            )
            .field(
                "process_sys_us_per_job",
                format!("{:.1}", per_job(self.after.system_us_since(&self.before))),
            )
            .field("servers", self.servers)
            .field("busiest_server_cpu_share", format!("{:.2}", self.busiest_share))
            .field("redis_errors", self.after.errors_since(&self.before))
            .field("client_cpu_us_per_job", format!("{:.1}", per_job(self.client_us)))
            .field("workers_cpu_us_per_job", format!("{:.1}", per_job(self.workers_us)))
    }
}
