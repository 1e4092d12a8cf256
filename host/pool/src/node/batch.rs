//! Dispatching many jobs at once: the jobs of a batch are grouped by the
//! worker their keys route to, each group's starts go in one
//! `dispatch.lua` (up to [`GROUP`] jobs; a single dispatch sends one), all
//! the groups' scripts in one pipeline, and the workers' answers are
//! awaited together. Each job is still claimed on its own, with its own
//! token and outcome: a batch changes how the starts travel, not what each
//! one guarantees.

use std::collections::BTreeMap;
use std::time::Instant;

use redis::Value;
use tracing::Instrument;

use super::Node;
use super::confirm::Sent;
use super::dispatch::{Start, dispatch_cmd, dispatched, not_sent, started};
use crate::core::{Dispatched, Waiter};
use crate::error::Result;
use crate::job::DispatchOutcome;
use crate::scripts;

/// Jobs one script starts, at most (a batch's group, or a lane's).
pub(super) const GROUP: usize = 500;

/// A job of the batch on its way: where its outcome goes, and the waiter
/// for its worker's answer.
struct Pending<'a> {
    index: usize,
    waiter: Waiter<'a>,
}

/// The jobs of one script: the revision and worker they were routed with.
struct Group<'a> {
    rev: u64,
    worker: String,
    jobs: Vec<Pending<'a>>,
}

impl Node {
    /// Dispatches `jobs` (each a key and a payload) as [`Node::dispatch`]
    /// does one: the starts of the jobs that route to one worker go in one
    /// script, the scripts in one pipeline, and the workers' answers are
    /// awaited together (each for up to `reply_timeout`). The outcomes are
    /// in the order of `jobs`; an invalid key or payload, or a failure to
    /// reach Redis, is the error of its own job only.
    ///
    /// # Cancel safety
    /// Not cancel safe: the jobs sent are dispatched whether or not their
    /// answers are awaited.
    ///
    /// With several slot groups, each group's jobs go as a batch of their
    /// own, all groups at once.
    pub async fn dispatch_batch(&self, jobs: &[(String, Vec<u8>)]) -> Vec<Result<DispatchOutcome>> {
        // One span for the batch: every start it sends continues it.
        let span = self.trace_span("job.dispatch_batch", "");
        if !span.is_disabled() {
            span.record("pulse.outcome", format!("{} jobs", jobs.len()));
        }
        let trace = pulse_telemetry::traceparent(&span).unwrap_or_default();
        self.dispatch_batch_traced(jobs, &trace).instrument(span).await
    }

    async fn dispatch_batch_traced(
        &self,
        jobs: &[(String, Vec<u8>)],
        trace: &str,
    ) -> Vec<Result<DispatchOutcome>> {
        let by_group = self.by_group(jobs.iter().map(|(key, _)| key.as_str()));
        let sends = by_group.iter().enumerate().map(|(group, indexes)| async move {
            let group_jobs: Vec<&(String, Vec<u8>)> = indexes.iter().map(|&index| &jobs[index]).collect();
            match group_jobs.is_empty() {
                true => Vec::new(),
                false => {
                    self.group(u32::try_from(group).unwrap_or(0))
                        .dispatch_batch_here(&group_jobs, trace)
                        .await
                }
            }
        });
        let answers = futures_util::future::join_all(sends).await;
        let mut outcomes: Vec<Option<Result<DispatchOutcome>>> = jobs.iter().map(|_| None).collect();
        for (indexes, answers) in by_group.into_iter().zip(answers) {
            for (index, outcome) in indexes.into_iter().zip(answers) {
                outcomes[index] = Some(outcome);
            }
        }
        outcomes.into_iter().map(|outcome| outcome.expect("an outcome per job")).collect()
    }

    /// [`Node::dispatch_batch`] of jobs of this node's slot group.
    async fn dispatch_batch_here(
        &self,
        jobs: &[&(String, Vec<u8>)],
        trace: &str,
    ) -> Vec<Result<DispatchOutcome>> {
        let began = Instant::now();
        let core = &self.core;
        let mut outcomes: Vec<Option<Result<DispatchOutcome>>> = jobs.iter().map(|_| None).collect();
        // By revision and worker, in the order of `jobs`.
        let mut groups: BTreeMap<(u64, String), Vec<Pending<'_>>> = BTreeMap::new();
        for (index, (key, payload)) in jobs.iter().enumerate() {
            if let Err(error) = self.validate(key, payload.len()) {
                outcomes[index] = Some(Err(error));
                continue;
            }
            let waiter = core.waiters.register(core.next_request());
            groups.entry(core.route(key)).or_default().push(Pending { index, waiter });
        }
        let mut groups: Vec<Group<'_>> = groups
            .into_iter()
            .flat_map(|((rev, worker), mut pending)| {
                let mut split = Vec::new();
                while pending.len() > GROUP {
                    let rest = pending.split_off(GROUP);
                    split.push(Group { rev, worker: worker.clone(), jobs: pending });
                    pending = rest;
                }
                split.push(Group { rev, worker, jobs: pending });
                split
            })
            .collect();
        let mut sent = Vec::new();
        // Sent again one by one: the slot table changed under them.
        let mut again = Vec::new();
        let answers = self.send_groups(jobs, &groups, trace).await;
        for (group, (answer, held)) in groups.drain(..).zip(answers) {
            match answer {
                Ok(answers) => {
                    for (pending, answer) in group.jobs.into_iter().zip(answers) {
                        match answer {
                            // Started on the primary, which may lose it with a failover.
                            Ok(Dispatched::Sent) if !held => {
                                outcomes[pending.index] = Some(Ok(DispatchOutcome::Unconfirmed));
                            }
                            Ok(Dispatched::Sent) => sent.push(pending),
                            Ok(Dispatched::Stale(_)) => again.push(pending.index),
                            Ok(other) => outcomes[pending.index] = Some(Ok(not_sent(other))),
                            Err(error) => outcomes[pending.index] = Some(Err(error)),
                        }
                    }
                }
                Err(error) => {
                    for pending in group.jobs {
                        outcomes[pending.index] =
                            Some(Err(core.redis_error("dispatch a batch")(error.clone())));
                    }
                }
            }
        }
        // Every answer is awaited up to the same deadline, in turn: most
        // have come by the time their turn comes.
        let deadline = tokio::time::Instant::now() + core.options.reply_timeout;
        for sent in &mut sent {
            outcomes[sent.index] = Some(started(sent.waiter.wait_until(deadline).await));
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

    /// Sends one `dispatch.lua` per group, all in one pipeline (with
    /// `WAIT` behind it when the node confirms on replicas); a script the
    /// server did not know is loaded and its groups sent again. Per group:
    /// its jobs' answers, in order, or why it failed; and whether the
    /// replicas asked for hold them.
    async fn send_groups(
        &self,
        jobs: &[&(String, Vec<u8>)],
        groups: &[Group<'_>],
        trace: &str,
    ) -> Vec<(redis::RedisResult<Vec<Result<Dispatched>>>, bool)> {
        let core = &self.core;
        let mut conn = core.conn.clone();
        let mut answers: Vec<Option<redis::RedisResult<Vec<Result<Dispatched>>>>> =
            groups.iter().map(|_| None).collect();
        let mut held = vec![true; groups.len()];
        let mut todo: Vec<usize> = (0..groups.len()).collect();
        let mut replies = Vec::with_capacity(groups.len());
        for group in groups {
            replies.push(core.dispatch_replies(&group.worker).await);
        }
        for attempt in 0..2 {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &g in &todo {
                let Group { rev, worker, jobs: pending } = &groups[g];
                let group: Vec<Start<'_>> = pending
                    .iter()
                    .map(|p| Start {
                        worker,
                        reply: &replies[g],
                        key: &jobs[p.index].0,
                        payload: &jobs[p.index].1,
                        request: &p.waiter.request,
                    })
                    .collect();
                pipe.add_command(dispatch_cmd(core, *rev, trace, &group));
            }
            let sent = match &self.confirm {
                None => pipe.query_async(&mut conn).await.map(|replies| Sent { replies, held: true }),
                Some(confirm) => confirm.send(pipe).await,
            };
            let replies: Vec<redis::RedisResult<Value>> = match sent {
                Ok(sent) => {
                    for &g in &todo {
                        held[g] = sent.held;
                    }
                    sent.replies
                }
                Err(error) => {
                    for &g in &todo {
                        answers[g] = Some(Err(error.clone()));
                    }
                    break;
                }
            };
            let mut unknown = Vec::new();
            for (&g, reply) in todo.iter().zip(replies) {
                match reply {
                    Err(error) if attempt == 0 && scripts::is_unknown_script(&error) => unknown.push(g),
                    Err(error) => answers[g] = Some(Err(error)),
                    Ok(value) => answers[g] = Some(Ok(dispatched(value, groups[g].jobs.len()))),
                }
            }
            if unknown.is_empty() {
                break;
            }
            if let Err(error) = scripts::load(&scripts::DISPATCH, &mut conn).await {
                for &g in &unknown {
                    answers[g] = Some(Err(error.clone()));
                }
                break;
            }
            todo = unknown;
        }
        answers.into_iter().map(|answer| answer.expect("every group has an answer")).zip(held).collect()
    }
}
