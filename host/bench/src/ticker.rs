//! The `ticker` scenario: one ticker held by three processes.
//!
//! Three processes (this program re-run as `serve-ticker`) hold the same
//! ticker (interval 100 ms) and print each tick they fire. After 50 ticks
//! the process that fired the last one is killed with SIGKILL, and 20 more
//! ticks are awaited from the others. Reported: ticks fired twice (must be
//! 0), ticks missed, how late ticks fired (p50/p99/max after their due
//! time), and the gap between the last tick before the kill and the first
//! after it (the interval when nothing is lost).

use std::collections::HashSet;
use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pulse_pool::{Node, NodeOptions};

use crate::Args;
use crate::report::{self, percentile};

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The hidden scenario name of a ticker process.
pub const SERVE_TICKER: &str = "serve-ticker";
const POOL: &str = "bench-ticker";
const TICKER: &str = "bench";
const INTERVAL: Duration = Duration::from_millis(100);
const HOLDERS: usize = 3;
/// How long a tick may take before the scenario gives up.
const PATIENCE: Duration = Duration::from_secs(30);

/// A tick as a holder printed it.
struct Fired {
    holder: usize,
    seq: u64,
    missed: u64,
    late: Duration,
    at: Instant,
}

pub fn run(args: &Args) -> BenchResult {
    let (before_kill, after_kill) = if args.quick { (10, 5) } else { (50, 20) };
    let server = match &args.redis {
        Some(_) => None,
        None => Some(pulse_testkit::RedisServer::start()),
    };
    let url = args.redis.clone().or_else(|| server.as_ref().map(|s| s.url().to_owned())).ok_or("no Redis")?;
    let (sender, ticks) = mpsc::channel();
    let mut holders: Vec<Child> = Vec::new();
    for holder in 0..HOLDERS {
        let mut child = Command::new(std::env::current_exe()?)
            .args([SERVE_TICKER, "--redis", &url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let sender = sender.clone();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                let fields: Vec<u64> = line.split(' ').skip(1).filter_map(|f| f.parse().ok()).collect();
                if let [seq, missed, late_ms] = fields[..] {
                    let fired = Fired {
                        holder,
                        seq,
                        missed,
                        late: Duration::from_millis(late_ms),
                        at: Instant::now(),
                    };
                    if sender.send(fired).is_err() {
                        return;
                    }
                }
            }
        });
        holders.push(child);
    }
    let next = || ticks.recv_timeout(PATIENCE).map_err(|_| "no tick within 30 s");
    let mut fired = Vec::new();
    while fired.len() < before_kill {
        fired.push(next()?);
    }
    let last = fired.last().ok_or("no tick")?;
    let (doomed, last_at) = (last.holder, last.at);
    holders[doomed].kill()?;
    holders[doomed].wait()?;
    let killed = fired.len();
    while fired.len() < killed + after_kill {
        let tick = next()?;
        if tick.holder != doomed {
            fired.push(tick);
        }
    }
    let gap = fired[killed].at - last_at;
    let mut seen = HashSet::new();
    let duplicated = fired.iter().filter(|t| !seen.insert(t.seq)).count();
    let missed: u64 = fired.iter().map(|t| t.missed).sum();
    let mut late: Vec<Duration> = fired.iter().map(|t| t.late).collect();
    let per_holder: Vec<usize> =
        (0..HOLDERS).map(|h| fired.iter().filter(|t| t.holder == h).count()).collect();
    for (i, holder) in holders.iter_mut().enumerate() {
        if i != doomed {
            drop(holder.stdin.take());
            holder.wait()?;
        }
    }
    // Remove the ticker from the Redis used (the killed holder left it).
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        let node = Node::client(&client, POOL, NodeOptions::default()).await?;
        node.ticker(TICKER, INTERVAL).await?.stop().await?;
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    report::Result::new("ticker")
        .field("holders", HOLDERS)
        .millis("interval_ms", INTERVAL)
        .field("ticks", fired.len())
        .field("duplicated", duplicated)
        .field("missed", missed)
        .millis("late_p50_ms", percentile(&mut late, 50.0))
        .millis("late_p99_ms", percentile(&mut late, 99.0))
        .millis("late_max_ms", percentile(&mut late, 100.0))
        .millis("gap_after_kill_ms", gap)
        .field("ticks_per_holder", per_holder.iter().map(usize::to_string).collect::<Vec<_>>().join("/"))
        .print();
    if duplicated > 0 {
        return Err(format!("{duplicated} ticks fired twice").into());
    }
    Ok(())
}

/// A ticker process: holds the ticker and prints `tick SEQ MISSED LATE_MS`
/// per tick it fires, until its stdin closes.
pub fn serve_ticker(args: &Args) -> BenchResult {
    let url = args.redis.clone().ok_or("serve-ticker needs --redis")?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        let node = Node::client(&client, POOL, NodeOptions::default()).await?;
        let mut ticker = node.ticker(TICKER, INTERVAL).await?;
        let mut stdin_closed = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        });
        loop {
            tokio::select! {
                tick = ticker.tick() => {
                    let Some(tick) = tick else { break };
                    println!("tick {} {} {}", tick.seq, tick.missed, tick.late.as_millis());
                }
                _ = &mut stdin_closed => break,
            }
        }
        node.close().await;
        Ok(())
    })
}
