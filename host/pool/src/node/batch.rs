//! Dispatching many jobs at once: the starts of a batch travel in
//! pipelines (one round trip per [`PIPELINE`] jobs, whichever workers they
//! go to) and their answers are awaited together. Each job is still its
//! own `dispatch.lua` step, with its own token and outcome: a batch changes
//! how the starts travel, not what each one guarantees.

use std::time::Instant;

use redis::Value;

use super::Node;
use super::dispatch::{not_sent, started};
use crate::core::{Dispatched, Waiter};
use crate::error::Result;
use crate::job::DispatchOutcome;
use crate::scripts;

/// Starts sent in one pipeline, at most.
const PIPELINE: usize = 1000;

/// A job of the batch whose start was sent: where its outcome goes, and
/// the waiter for its worker's answer.
struct Sent<'a> {
    index: usize,
    waiter: Waiter<'a>,
}

impl Node {
    /// Dispatches `jobs` (each a key and a payload) as [`Node::dispatch`]
    /// does one: the starts go in pipelines, and the workers' answers are
    /// awaited together (each for up to `reply_timeout`). The outcomes are
    /// in the order of `jobs`; an invalid key or payload, or a failure to
    /// reach Redis, is the error of its own job only.
    ///
    /// # Cancel safety
    /// Not cancel safe: the jobs sent are dispatched whether or not their
    /// answers are awaited.
    pub async fn dispatch_batch(&self, jobs: &[(String, Vec<u8>)]) -> Vec<Result<DispatchOutcome>> {
        let began = Instant::now();
        let core = &self.core;
        let mut outcomes: Vec<Option<Result<DispatchOutcome>>> = jobs.iter().map(|_| None).collect();
        let mut sent = Vec::new();
        // Sent again one by one: the slot table changed under them.
        let mut again = Vec::new();
        let valid: Vec<usize> = (0..jobs.len())
            .filter(|&index| {
                let (key, payload) = &jobs[index];
                match self.validate(key, payload.len()) {
                    Ok(()) => true,
                    Err(error) => {
                        outcomes[index] = Some(Err(error));
                        false
                    }
                }
            })
            .collect();
        for chunk in valid.chunks(PIPELINE) {
            let waiters: Vec<(usize, Waiter<'_>)> =
                chunk.iter().map(|&index| (index, core.waiters.register(core.next_request()))).collect();
            for ((index, waiter), answer) in self.send_starts(jobs, waiters).await {
                match answer {
                    Ok(Dispatched::Sent) => sent.push(Sent { index, waiter }),
                    Ok(Dispatched::Stale(_)) => again.push(index),
                    Ok(other) => outcomes[index] = Some(Ok(not_sent(other))),
                    Err(error) => outcomes[index] = Some(Err(error)),
                }
            }
        }
        let timeout = core.options.reply_timeout;
        let answers =
            futures_util::future::join_all(sent.iter_mut().map(|sent| sent.waiter.wait(timeout))).await;
        for (sent, answer) in sent.iter().zip(answers) {
            outcomes[sent.index] = Some(started(answer));
        }
        for outcome in outcomes.iter().flatten().flatten() {
            core.metrics.dispatched(outcome, began.elapsed());
        }
        drop(sent);
        if !again.is_empty() {
            core.routing_retries.fetch_add(again.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let retried = futures_util::future::join_all(
                again.iter().map(|&index| self.dispatch(&jobs[index].0, &jobs[index].1)),
            )
            .await;
            for (index, outcome) in again.into_iter().zip(retried) {
                outcomes[index] = Some(outcome);
            }
        }
        outcomes.into_iter().map(|outcome| outcome.expect("every job has an outcome")).collect()
    }

    /// Sends the starts of `waiters`' jobs in one pipeline; those the
    /// server did not know the script for are sent again once it is
    /// loaded.
    async fn send_starts<'a>(
        &self,
        jobs: &[(String, Vec<u8>)],
        mut waiters: Vec<(usize, Waiter<'a>)>,
    ) -> Vec<((usize, Waiter<'a>), Result<Dispatched>)> {
        let core = &self.core;
        let mut conn = core.conn.clone();
        let mut done = Vec::with_capacity(waiters.len());
        for attempt in 0..2 {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (index, waiter) in &waiters {
                let (key, payload) = &jobs[*index];
                pipe.add_command(self.dispatch_cmd(key, payload, &waiter.request));
            }
            let answers: Vec<redis::RedisResult<Value>> = match pipe.query_async(&mut conn).await {
                Ok(answers) => answers,
                Err(error) => {
                    let failed = waiters
                        .into_iter()
                        .map(|w| (w, Err(core.redis_error("dispatch a batch")(error.clone()))));
                    done.extend(failed);
                    return done;
                }
            };
            let mut unknown = Vec::new();
            for (waiter, answer) in waiters.into_iter().zip(answers) {
                match answer {
                    Err(error) if attempt == 0 && scripts::is_unknown_script(&error) => unknown.push(waiter),
                    Err(error) => done.push((waiter, Err(core.redis_error("dispatch")(error)))),
                    Ok(value) => {
                        let parsed = redis::from_redis_value::<Vec<Value>>(value)
                            .map_err(|error| crate::core::protocol("dispatch", &error.to_string()))
                            .and_then(|answer| Dispatched::parse(&answer));
                        done.push((waiter, parsed));
                    }
                }
            }
            if unknown.is_empty() {
                break;
            }
            if let Err(error) = scripts::load(&scripts::DISPATCH, &mut conn).await {
                let failed = unknown
                    .into_iter()
                    .map(|w| (w, Err(core.redis_error("dispatch a batch")(error.clone()))));
                done.extend(failed);
                break;
            }
            waiters = unknown;
        }
        done
    }
}
