//! Traces exported over OTLP: one trace from the API's caller to the
//! guest's own HTTP request, through Redis, and a notification's trace
//! linked to the one that started its job. Read back from a collector as
//! the OpenTelemetry protocol's types, and from the headers the service
//! the guest called received.

use pulse_testkit::otlp::{self, Span};
use pulse_testkit::plugins::FETCHER;
use pulse_testkit::{HttpServer, RedisServer};
use serde_json::json;

use crate::http::Served;
use crate::{eventually, write_config};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const NOTIFIER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const NOTIFIER_SPAN: &str = "b7ad6b7169203331";

/// The one span named `name` in trace `trace`.
fn one<'a>(spans: &'a [Span], trace: &str, name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.trace_id == trace && s.name == name).collect();
    assert_eq!(found.len(), 1, "one span {name:?} in trace {trace}; all spans: {spans:#?}");
    found[0]
}

/// The `traceparent` the service received with the request `method` `path`.
fn received_traceparent(endpoints: &HttpServer, method: &str, path: &str) -> String {
    let received = endpoints.received();
    let request = received.iter().find(|r| r.method == method && r.path == path).expect("the request");
    request.headers.iter().find(|(name, _)| name == "traceparent").map(|(_, v)| v.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_is_one_trace_from_the_caller_to_the_guests_request_and_a_notification_links_to_it() {
    let collector = otlp::collector();
    let endpoints = HttpServer::start();
    endpoints.set("/t1", b"first");
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let plugin = format!("allowed_outbound_hosts = [\"http://{}\"]", endpoints.address());
    let config = write_config(
        dir.path(),
        &[("fetcher", FETCHER, &plugin)],
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n\n[telemetry]\notlp_endpoint = \"http://{}\"\nservice_name = \"pulse-test\"\n",
            collector.address()
        ),
    );
    let api = Served::start(&config, redis.url(), None).await;

    // Polls once at its start (the next poll is an hour away).
    let payload = format!("{} 3600000", endpoints.url("/t1"));
    let started = api
        .post_traced(
            "/api/pools/fetcher/jobs",
            json!({"key": "t1", "payload": payload}),
            &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"),
        )
        .await;
    assert_eq!((started.0, started.1["outcome"].as_str()), (201, Some("started")), "{started:?}");
    eventually("the job polled its endpoint", || endpoints.count("/t1") >= 1);
    let notified = api
        .post_traced(
            "/api/pools/fetcher/jobs/t1/notify",
            json!({"payload": "ping"}),
            &format!("00-{NOTIFIER_TRACE}-{NOTIFIER_SPAN}-01"),
        )
        .await;
    assert_eq!(notified.0, 200, "{notified:?}");
    eventually("the notification posted to the endpoint", || {
        endpoints.received().iter().any(|r| r.method == "POST" && r.path == "/t1")
    });
    let job = api.get("/api/pools/fetcher/jobs/t1").await.1;
    // A host that leaves sends the spans it still holds.
    assert_eq!(api.host.terminate(), 0);
    let spans = otlp::spans(&collector);
    assert!(spans.iter().all(|s| s.service == "pulse-test"), "{spans:#?}");

    // The dispatch: the API's caller → its request → the dispatch → the
    // worker's start (across Redis) → the guest's start → its GET.
    let request = one(&spans, CALLER_TRACE, "POST /api/pools/{pool}/jobs");
    assert_eq!((request.parent_span_id.as_str(), request.kind), (CALLER_SPAN, 2), "{request:#?}");
    let dispatch = one(&spans, CALLER_TRACE, "job.dispatch");
    assert_eq!(dispatch.parent_span_id, request.span_id, "{dispatch:#?}");
    assert_eq!((dispatch.attribute("pulse.pool"), dispatch.attribute("pulse.job.key")), ("fetcher", "t1"));
    let start = one(&spans, CALLER_TRACE, "worker.start");
    assert_eq!(start.parent_span_id, dispatch.span_id, "{start:#?}");
    assert_eq!((start.attribute("pulse.pool"), start.attribute("pulse.job.key")), ("fetcher", "t1"));
    assert_eq!(start.attribute("pulse.worker"), job["worker"].as_str().unwrap(), "{start:#?}");
    assert!(
        !start.attribute("pulse.node").is_empty() && !start.attribute("pulse.token").is_empty(),
        "{start:#?}"
    );
    let guest = one(&spans, CALLER_TRACE, "plugin.start");
    assert_eq!(guest.parent_span_id, start.span_id, "{guest:#?}");
    assert_eq!(guest.attribute("pulse.plugin"), "fetcher");
    assert!(guest.attribute("pulse.release").starts_with("sha256:"), "{guest:#?}");
    let get = one(&spans, CALLER_TRACE, "GET");
    assert_eq!((get.parent_span_id.as_str(), get.kind), (guest.span_id.as_str(), 3), "{get:#?}");
    assert_eq!(get.attribute("http.response.status_code"), "200");
    assert_eq!(
        received_traceparent(&endpoints, "GET", "/t1"),
        format!("00-{CALLER_TRACE}-{}-01", get.span_id),
        "the service called continues the trace"
    );

    // The notification: a trace of its own, its worker's span linked to
    // the dispatch that started the job.
    let notify = one(&spans, NOTIFIER_TRACE, "job.notify");
    let request = one(&spans, NOTIFIER_TRACE, "POST /api/pools/{pool}/jobs/{key}/notify");
    assert_eq!(
        (notify.parent_span_id.as_str(), request.parent_span_id.as_str()),
        (request.span_id.as_str(), NOTIFIER_SPAN)
    );
    let delivered = one(&spans, NOTIFIER_TRACE, "worker.notify");
    assert_eq!(delivered.parent_span_id, notify.span_id, "{delivered:#?}");
    assert_eq!(
        delivered.links,
        vec![(CALLER_TRACE.to_owned(), dispatch.span_id.clone())],
        "linked to the job's dispatch"
    );
    assert_eq!(delivered.attribute("pulse.token"), start.attribute("pulse.token"));
    let guest = one(&spans, NOTIFIER_TRACE, "plugin.notify");
    assert_eq!(guest.parent_span_id, delivered.span_id);
    let post = one(&spans, NOTIFIER_TRACE, "POST");
    assert_eq!(post.parent_span_id, guest.span_id);
    assert_eq!(
        received_traceparent(&endpoints, "POST", "/t1"),
        format!("00-{NOTIFIER_TRACE}-{}-01", post.span_id)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_keeps_a_callers_decision_and_drops_traces_begun_here_at_ratio_zero() {
    let collector = otlp::collector();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &[("echo", pulse_testkit::plugins::ECHO, "")],
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n\n[telemetry]\notlp_endpoint = \"http://{}\"\nsample_ratio = 0.0\n",
            collector.address()
        ),
    );
    let api = Served::start(&config, redis.url(), None).await;
    let untraced = api.post("/api/pools/echo/jobs", json!({"key": "begun-here"})).await;
    let kept = api
        .post_traced(
            "/api/pools/echo/jobs",
            json!({"key": "sampled"}),
            &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"),
        )
        .await;
    let dropped = api
        .post_traced(
            "/api/pools/echo/jobs",
            json!({"key": "not-sampled"}),
            &format!("00-{NOTIFIER_TRACE}-{NOTIFIER_SPAN}-00"),
        )
        .await;
    for answer in [&untraced, &kept, &dropped] {
        assert_eq!(answer.0, 201, "{answer:?}");
    }
    assert_eq!(api.host.terminate(), 0);
    let spans = otlp::spans(&collector);
    let keys: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.attribute("pulse.job.key")).collect();
    assert!(spans.iter().all(|s| s.trace_id == CALLER_TRACE), "only the sampled caller's trace: {spans:#?}");
    assert_eq!(keys, ["", "sampled"].into_iter().collect(), "{spans:#?}");
    one(&spans, CALLER_TRACE, "worker.start");
    one(&spans, CALLER_TRACE, "plugin.start");
}
