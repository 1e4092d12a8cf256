//! The benchmark program of pulse-host.
//!
//! ```text
//! cargo run --release -p pulse-bench -- SCENARIO [--quick]
//! ```
//!
//! Each scenario prints one line per configuration, for machines to read:
//! `RESULT scenario=NAME key=value …`, plain numbers with the unit in the key
//! (`_ms`, `_us`, `_mib`, `_per_s`). Scenarios:
//!
//! - `runtime [echo|python-echo|js-echo]…`: plugin compile and cached load
//!   time, instantiation latency, call overhead at 16 B and 64 KiB,
//!   resident memory of idle instances; for the `echo` plugin in Rust,
//!   Python and JavaScript (default: all three).
//! - `dispatch [noop|echo-job|echo-worker|echo-http|echo-http2|slow|slow-serial|batch]…`:
//!   confirmed starts per second and their latency, with 1 and 32
//!   concurrent dispatchers on a client-only node and 4 workers in another
//!   process, running a no-op handler, or the `echo` plugin in job or in
//!   worker isolation, or in worker isolation dispatched through the
//!   host's HTTP API; or the `slow` plugin (starts waiting 50 ms, job
//!   isolation) with 32 and 128 dispatchers, and with one call at a time
//!   per worker (`slow-serial`, 128); or in batches of 1,000 (`batch`:
//!   `batch-pool` through the pool's `dispatch_batch` to no-op workers,
//!   `batch-http` through `POST …/batch` to `echo-worker`; 1 and 4
//!   batches in flight). Default: all but `slow-serial`.
//!   Redis commands and CPU per job. Options: `--jobs N` (default 20,000;
//!   5,000 for `echo-job`, 2,000 for `slow`, 400 for `slow-serial`),
//!   `--redis URL` (default: a private `redis-server`; a
//!   `redis+cluster://` URL's figures are read from each seed it names,
//!   so name every master), `--redis cluster`
//!   (a private single server, then a private cluster of 3 masters, or
//!   `--masters N`, with `--groups N` slot groups, default 16: the same
//!   lines on both, with
//!   the Redis CPU summed over the masters, the busiest one's share and
//!   the errors Redis answered; `noop` and `batch-pool` only),
//!   `--groups N` (the pools' slot groups), `--workers N` (the no-op
//!   workers of `noop` and `batch-pool`, default 4), `--dispatchers N`
//!   (one measured line per handler, with N concurrent dispatchers, or N
//!   batches in flight, instead of the handler's usual lines),
//!   `--confirm-replicas N` (the dispatching node confirms a start only
//!   once N replicas hold it; given without `--redis`, 0 too, the private
//!   server is on TCP with a replica).
//! - `fetch`: two hosts run 1,000 `fetcher` jobs that poll a loopback
//!   server answering in 20 ms, once a second each: requests per second
//!   (against 1,000 asked), the hosts' request latency (mean, p99 bucket)
//!   and resident memory. `fetch http2`: the server speaks HTTP/2 over
//!   TLS instead of HTTP/1.1. Options: `--jobs N`.
//! - `idle`: two hosts serve one pool; after 10 s without traffic, one
//!   dispatch through the pool's client and one through the HTTP API:
//!   p50 and max latency per path (5 rounds); then 8 pipelined requests
//!   on one connection to the API (20 rounds). Target: max ≤ 50 ms.
//! - `failover`: two processes with 2 workers each (lease TTL 2 s) run
//!   1,000 jobs; one is killed with SIGKILL: time until the last of its
//!   jobs was started again by the survivor's handler (`started_ms`, from
//!   the handlers' own records) and until the listing shows every job on
//!   the survivor (`listed_ms`), lost and duplicated jobs.
//! - `rebalance`: 4 workers run 1,000 jobs; a fifth joins, then the first
//!   leaves: time to settle, jobs moved vs expected, misplaced after
//!   settling, most and fewest jobs and slots per worker. Then a host of
//!   two workers is killed beside another: the survivor's own jobs started
//!   again (`survivors_moved`, target 0).
//! - `ticker`: three processes hold one ticker (100 ms); the one that fired
//!   last is killed with SIGKILL: ticks fired twice, missed, how late, and
//!   the gap across the kill.
//! - `rollout`: two hosts run 1,000 `counter` jobs; the plugin's file is
//!   replaced by `counter-v2` and each host gets SIGHUP in turn: time per
//!   reload and in all, job moves per job (target ≤ 1), jobs lost.
//!   Options: `--jobs N`. Then a bad release on the first host, undone by
//!   its upgrade gate (`bad-release`).
//! - `listing`: a page of 100 jobs of a pool of 1,000,000, as `pulse-host
//!   jobs --limit 100` reads it: all jobs, by key prefix, by a state no job
//!   is in; p50 and max against 100 ms. Options: `--jobs N`.
//! - `density [job|worker]…`: one host runs 100,000 `counter` jobs
//!   (`--jobs N`) ticking every 10 s, in job and in worker isolation:
//!   resident memory per live job, timer calls per second and their
//!   lateness, notification latency, then a second host joining: the time
//!   until it holds its share, jobs moved and moves per moved job.
//!
//! `--quick` runs fewer iterations (a smoke test of the program itself).
#![allow(clippy::print_stdout, reason = "the program's output is its RESULT lines")]

mod density;
mod dispatch;
mod fetch;
mod idle;
mod listing;
mod membership;
mod process;
mod report;
mod rollout;
mod runtime;
mod scrape;
mod ticker;

use std::process::ExitCode;

/// The allocator of `pulse-host`, so that the hosts this program runs
/// allocate as the binary does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: pulse-bench SCENARIO [--quick] [--jobs N] [--redis URL] [--confirm-replicas N] [--groups N] [--masters N] [--workers N] [--dispatchers N]\nscenarios: runtime [echo|python-echo|js-echo]..., dispatch [noop|echo-job|echo-worker|echo-http|echo-http2|slow|slow-serial|batch]..., idle, fetch [http1|http2]..., failover, rebalance, ticker, rollout, listing, density [job|worker]...";

/// Parsed command line.
#[derive(Debug)]
pub struct Args {
    /// Fewer iterations.
    pub quick: bool,
    /// `--jobs N`.
    pub jobs: Option<usize>,
    /// `--redis URL`.
    pub redis: Option<String>,
    /// `--pool NAME` (worker processes).
    pub pool: Option<String>,
    /// `--workers N` (worker processes).
    pub workers: Option<usize>,
    /// `--confirm-replicas N` (dispatch): the dispatching node's
    /// `confirm_replicas`; when given without `--redis` (0 too, for a
    /// comparison on the same set-up), the scenario's server is on TCP
    /// with a replica.
    pub confirm_replicas: Option<u32>,
    /// `--groups N`: the pools' slot groups.
    pub groups: Option<u32>,
    /// `--masters N` (dispatch with `--redis cluster`): the private
    /// cluster's masters, default 3.
    pub masters: Option<usize>,
    /// `--dispatchers N` (dispatch): one measured line per handler, at N
    /// concurrent dispatchers (batches in flight for the batch lines).
    pub dispatchers: Option<usize>,
    /// Everything else, in order.
    pub rest: Vec<String>,
}

/// The number given after `flag`, within `range`.
fn number_in<T>(value: Option<String>, flag: &str, range: std::ops::RangeInclusive<T>) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    let value = value.ok_or_else(|| format!("{flag} needs a number"))?;
    value
        .parse::<T>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| format!("{flag} takes {} to {}, got {value:?}", range.start(), range.end()))
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        quick: false,
        jobs: None,
        redis: None,
        pool: None,
        workers: None,
        confirm_replicas: None,
        groups: None,
        masters: None,
        dispatchers: None,
        rest: Vec::new(),
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => parsed.quick = true,
            "--jobs" => {
                let value = args.next().ok_or("--jobs needs a number")?;
                parsed.jobs =
                    Some(value.parse().map_err(|_| format!("--jobs takes a whole number, got {value:?}"))?);
            }
            "--redis" => parsed.redis = Some(args.next().ok_or("--redis needs a URL")?),
            "--pool" => parsed.pool = Some(args.next().ok_or("--pool needs a name")?),
            "--workers" => {
                let value = args.next().ok_or("--workers needs a number")?;
                parsed.workers = Some(
                    value.parse().map_err(|_| format!("--workers takes a whole number, got {value:?}"))?,
                );
            }
            "--confirm-replicas" => {
                parsed.confirm_replicas = Some(number_in::<u32>(args.next(), "--confirm-replicas", 0..=16)?)
            }
            "--groups" => {
                let value = args.next().ok_or("--groups needs a number")?;
                parsed.groups = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| n.is_power_of_two() && *n <= 64)
                    .ok_or_else(|| format!("--groups takes 1, 2, 4, 8, 16, 32 or 64, got {value:?}"))
                    .map(Some)?;
            }
            "--masters" => parsed.masters = Some(number_in::<usize>(args.next(), "--masters", 1..=16)?),
            "--dispatchers" => {
                parsed.dispatchers = Some(number_in::<usize>(args.next(), "--dispatchers", 1..=4096)?)
            }
            other if other.starts_with("--") => return Err(format!("unknown option {other}")),
            _ => parsed.rest.push(arg),
        }
    }
    Ok(parsed)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("pulse-bench: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let quick = args.quick;
    let Some(scenario) = args.rest.first().cloned() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match scenario.as_str() {
        "runtime" => runtime::run(&args.rest[1..], quick),
        "dispatch" => dispatch::run(&args),
        // The worker process the dispatch scenario spawns.
        dispatch::SERVE_WORKERS => dispatch::serve_workers(&args),
        dispatch::SERVE_HOST => dispatch::serve_host(&args),
        "idle" => idle::run(&args),
        "fetch" => fetch::run(&args),
        "failover" => membership::failover(&args),
        "rebalance" => membership::rebalance(&args),
        // The worker processes of the failover scenario.
        membership::SERVE_COUNTING => membership::serve_counting(&args),
        "ticker" => ticker::run(&args),
        "rollout" => rollout::run(&args),
        "listing" => listing::run(&args),
        "density" => density::run(&args),
        // The processes of the ticker scenario.
        ticker::SERVE_TICKER => ticker::serve_ticker(&args),
        other => {
            eprintln!("pulse-bench: unknown scenario {other:?}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pulse-bench: {scenario} failed: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn args(line: &str) -> Result<super::Args, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn numbers_are_read_and_bounded() {
        assert_eq!(args("dispatch noop --dispatchers 512").unwrap().dispatchers, Some(512));
        assert_eq!(args("dispatch noop").unwrap().dispatchers, None);
        for bad in ["0", "4097", "many"] {
            let error = args(&format!("dispatch --dispatchers {bad}")).unwrap_err();
            assert!(error.contains("--dispatchers takes 1 to 4096"), "{error}");
        }
        assert!(args("dispatch --dispatchers").unwrap_err().contains("--dispatchers needs a number"));
        assert!(args("dispatch --masters 17").unwrap_err().contains("--masters takes 1 to 16, got \"17\""));
        assert_eq!(args("dispatch --confirm-replicas 0").unwrap().confirm_replicas, Some(0));
    }
}
