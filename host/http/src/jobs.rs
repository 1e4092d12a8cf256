//! The job routes: list, status, dispatch (one or a batch), stop, notify,
//! retry, forget. Every answer of the pool is a typed outcome, in JSON
//! with `key` and `outcome`, and a status code that fits it; answers that
//! are not successes also carry `error` (same as `outcome`) and `message`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pulse_pool::{DispatchOutcome, EventOutcome, JobState};
use serde::Serialize;
use serde_json::{Value, json};

use crate::Api;
use crate::body::{Batch, Body, JobsQuery, NewJob, Payload, QueryOf};
use crate::error::ApiError;

/// Most jobs one batch may hold.
pub(crate) const MAX_BATCH: usize = 1000;

/// An outcome answer: `{"key", "outcome", ...}` with its status, written
/// straight from this type (no JSON value built on the way).
#[derive(Serialize)]
struct Outcome<'a> {
    #[serde(skip)]
    status: StatusCode,
    key: &'a str,
    outcome: &'static str,
    /// The outcome again, on answers that are not successes.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Cow<'static, str>>,
    /// The state of the job that holds the key (`exists`).
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'static str>,
}

impl<'a> Outcome<'a> {
    fn new(
        status: StatusCode,
        key: &'a str,
        outcome: &'static str,
        message: Option<Cow<'static, str>>,
    ) -> Self {
        let error = (!status.is_success()).then_some(outcome);
        Self { status, key, outcome, error, message, state: None }
    }

    /// `error` as the outcome of `key`.
    fn of_error(key: &'a str, error: &ApiError) -> Self {
        let message = Cow::Owned(error.message.clone());
        Self {
            status: error.status,
            key,
            outcome: error.code,
            error: Some(error.code),
            message: Some(message),
            state: None,
        }
    }
}

impl IntoResponse for Outcome<'_> {
    fn into_response(self) -> Response {
        let full = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let mut response = (self.status, Json(&self)).into_response();
        if full {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// One answer of a batch: its outcome with its status.
#[derive(Serialize)]
struct BatchAnswer<'a> {
    #[serde(flatten)]
    outcome: Outcome<'a>,
    status: u16,
}

fn dispatch_outcome(key: &str, outcome: DispatchOutcome) -> Outcome<'_> {
    match outcome {
        DispatchOutcome::Started => Outcome::new(StatusCode::CREATED, key, "started", None),
        DispatchOutcome::Queued => Outcome::new(
            StatusCode::ACCEPTED,
            key,
            "queued",
            Some("no worker is alive; the job starts when one joins".into()),
        ),
        DispatchOutcome::AlreadyExists(state) => {
            let message = format!("the key is taken by a {} job", state.as_str());
            Outcome {
                state: Some(state.as_str()),
                ..Outcome::new(StatusCode::CONFLICT, key, "exists", Some(message.into()))
            }
        }
        DispatchOutcome::Refused(message) => {
            Outcome::new(StatusCode::UNPROCESSABLE_ENTITY, key, "refused", Some(message.into()))
        }
        DispatchOutcome::Failed(message) => {
            Outcome::new(StatusCode::FAILED_DEPENDENCY, key, "failed", Some(message.into()))
        }
        DispatchOutcome::PoolFull => Outcome::new(
            StatusCode::SERVICE_UNAVAILABLE,
            key,
            "full",
            Some("the pool holds node.max_jobs jobs".into()),
        ),
        DispatchOutcome::Unconfirmed => Outcome::new(
            StatusCode::GATEWAY_TIMEOUT,
            key,
            "unconfirmed",
            Some("sent, but no worker confirmed the start in time; dispatching again answers exists".into()),
        ),
    }
}

fn event_outcome<'a>(key: &'a str, outcome: EventOutcome, done: &'static str) -> Outcome<'a> {
    match outcome {
        EventOutcome::Done => Outcome::new(StatusCode::OK, key, done, None),
        EventOutcome::Held => Outcome::new(
            StatusCode::ACCEPTED,
            key,
            "held",
            Some("the job waits for a worker; it gets this after its start".into()),
        ),
        EventOutcome::NoSuchJob => no_such_job(key),
        EventOutcome::JobFailed(reason) => {
            Outcome::new(StatusCode::CONFLICT, key, "job_failed", Some(reason.into()))
        }
        EventOutcome::HandlerError(message) => {
            Outcome::new(StatusCode::UNPROCESSABLE_ENTITY, key, "handler_error", Some(message.into()))
        }
        EventOutcome::Unconfirmed => Outcome::new(
            StatusCode::GATEWAY_TIMEOUT,
            key,
            "unconfirmed",
            Some("sent, but not confirmed in time".into()),
        ),
    }
}

/// `GET /api/pools/{pool}/jobs`: a page of jobs, sorted by key within the
/// page, with the cursor of the next page (`null` after the last).
pub(crate) async fn list(
    State(api): State<Api>,
    Path(pool): Path<String>,
    QueryOf(query): QueryOf<JobsQuery>,
) -> Result<Json<Value>, ApiError> {
    let node = api.node(&pool)?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=pulse_pool::MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "`limit` = {limit}: allowed are 1 to {}",
            pulse_pool::MAX_PAGE
        )));
    }
    let state = match query.state.as_deref() {
        None => None,
        Some(text) => Some(
            JobState::parse_filter(text).map_err(|why| ApiError::bad_request(format!("`state` = {why}")))?,
        ),
    };
    let cursor: u64 = match query.cursor.as_deref() {
        None => 0,
        Some(text) => text.parse().map_err(|_| {
            ApiError::bad_request(format!("`cursor` = {text:?}: give the next_cursor of the previous page"))
        })?,
    };
    let prefix = query.prefix.unwrap_or_default();
    let page = node.list_jobs(&pulse_pool::JobsQuery { state, prefix, limit, cursor }).await?;
    let (jobs, next) = (page.jobs, page.next_cursor.map(|cursor| cursor.to_string()));
    Ok(Json(json!({"jobs": jobs, "next_cursor": next})))
}

/// `GET /api/pools/{pool}/jobs/{key}`.
pub(crate) async fn status(
    State(api): State<Api>,
    Path((pool, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    match node.status(&key).await? {
        Some(job) => Ok(Json(job).into_response()),
        None => Ok(no_such_job(&key).into_response()),
    }
}

/// `POST /api/pools/{pool}/jobs`: dispatches one job and answers once a
/// worker started it (or with why not).
pub(crate) async fn dispatch(
    State(api): State<Api>,
    Path(pool): Path<String>,
    Body(job): Body<NewJob>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    let (key, payload) = job.into_parts();
    let outcome = node.dispatch(&key, &payload?).await?;
    Ok(dispatch_outcome(&key, outcome).into_response())
}

/// `POST /api/pools/{pool}/batch`: dispatches up to [`MAX_BATCH`] jobs
/// through the pool's batch dispatch (their starts travel together);
/// answers 200 with each job's outcome and its status, in the order
/// given.
pub(crate) async fn batch(
    State(api): State<Api>,
    Path(pool): Path<String>,
    Body(batch): Body<Batch>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    if batch.jobs.is_empty() || batch.jobs.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "a batch of {} jobs: allowed are 1 to {MAX_BATCH}",
            batch.jobs.len()
        )));
    }
    let mut jobs = Vec::with_capacity(batch.jobs.len());
    let mut bad = Vec::new();
    for (index, job) in batch.jobs.into_iter().enumerate() {
        match job.into_parts() {
            (key, Ok(payload)) => jobs.push((key, payload)),
            (key, Err(error)) => bad.push((index, key, error)),
        }
    }
    let outcomes = node.dispatch_batch(&jobs).await;
    let mut dispatched = jobs.iter().zip(outcomes);
    let mut bad = bad.iter().peekable();
    let mut results = Vec::with_capacity(jobs.len() + bad.len());
    let mut counts = BTreeMap::<&'static str, u64>::new();
    for index in 0.. {
        let outcome = match bad.next_if(|(at, _, _)| *at == index) {
            Some((_, key, error)) => Outcome::of_error(key, error),
            None => match dispatched.next() {
                Some(((key, _), Ok(outcome))) => dispatch_outcome(key, outcome),
                Some(((key, _), Err(error))) => Outcome::of_error(key, &ApiError::from(error)),
                None => break,
            },
        };
        *counts.entry(outcome.outcome).or_default() += 1;
        results.push(BatchAnswer { status: outcome.status.as_u16(), outcome });
    }
    Ok(Json(BatchAnswers { results, counts }).into_response())
}

/// The answer of a batch: each job's, in the order given, and how many
/// had each outcome.
#[derive(Serialize)]
struct BatchAnswers<'a> {
    results: Vec<BatchAnswer<'a>>,
    counts: BTreeMap<&'static str, u64>,
}

/// `DELETE /api/pools/{pool}/jobs/{key}`: stops the job (its handler's
/// `stop`).
pub(crate) async fn stop(
    State(api): State<Api>,
    Path((pool, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    let outcome = node.stop(&key).await?;
    Ok(event_outcome(&key, outcome, "stopped").into_response())
}

/// `POST /api/pools/{pool}/jobs/{key}/notify`.
pub(crate) async fn notify(
    State(api): State<Api>,
    Path((pool, key)): Path<(String, String)>,
    Body(payload): Body<Payload>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    let outcome = node.notify(&key, &payload.bytes()?).await?;
    Ok(event_outcome(&key, outcome, "notified").into_response())
}

/// `POST /api/pools/{pool}/jobs/{key}/retry`: a failed job starts again
/// from its first attempt.
pub(crate) async fn retry(
    State(api): State<Api>,
    Path((pool, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    Ok(match node.retry(&key).await? {
        true => {
            Outcome::new(StatusCode::ACCEPTED, &key, "queued", Some("queued again from attempt 1".into()))
        }
        false => no_failed_job(&key),
    }
    .into_response())
}

/// `POST /api/pools/{pool}/jobs/{key}/forget`: a failed job is removed,
/// freeing its key.
pub(crate) async fn forget(
    State(api): State<Api>,
    Path((pool, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let node = api.node(&pool)?;
    Ok(match node.forget(&key).await? {
        true => Outcome::new(StatusCode::OK, &key, "forgotten", None),
        false => no_failed_job(&key),
    }
    .into_response())
}

fn no_such_job(key: &str) -> Outcome<'_> {
    Outcome::new(StatusCode::NOT_FOUND, key, "no_such_job", Some("no job has this key".into()))
}

fn no_failed_job(key: &str) -> Outcome<'_> {
    Outcome::new(StatusCode::NOT_FOUND, key, "no_failed_job", Some("no failed job has this key".into()))
}
