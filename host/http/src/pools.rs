//! The pool routes: every pool this host serves with its counts, a pool's
//! workers and nodes, the events its plugins emitted.

use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};

use crate::Api;
use crate::body::{EventsQuery, QueryOf, show_payload};
use crate::error::ApiError;

/// Most events one request may read.
const MAX_EVENTS: usize = 1000;

/// `GET /api/pools`.
pub(crate) async fn list(State(api): State<Api>) -> Result<Json<Value>, ApiError> {
    let mut pools = Vec::new();
    for (name, pool) in api.pools() {
        let counts = pool.node.job_counts().await?;
        let rollout = pool.node.rollout().await?;
        let refused = pool.node.refused_releases().await?;
        let nodes = pool.node.nodes();
        pools.push(json!({
            "name": name,
            "node": pool.node.id(),
            "workers_here": pool.plugin.is_some(),
            "slot_groups": pool.node.slot_groups(),
            "nodes": nodes.len(),
            "workers": nodes.iter().map(|n| n.workers.len()).sum::<usize>(),
            "jobs": {"running": counts.running, "queued": counts.queued, "failed": counts.failed},
            "rollout": rollout,
            "refused": refused,
        }));
    }
    Ok(Json(json!({"pools": pools})))
}

/// `GET /api/pools/{pool}/workers`: by join number, with the nodes
/// hosting them.
pub(crate) async fn workers(
    State(api): State<Api>,
    Path(pool): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let node = api.node(&pool)?;
    let workers: Vec<Value> = node
        .workers()
        .await?
        .iter()
        .map(|w| {
            json!({"id": w.id, "node": w.node, "join": w.join, "slots": w.slots, "jobs": w.jobs,
                   "digest": w.release.digest, "version": w.release.version})
        })
        .collect();
    let nodes = node.described_nodes().await?;
    Ok(Json(json!({"workers": workers, "nodes": nodes})))
}

/// `GET /api/pools/{pool}/events`: the newest events the pool's plugins
/// emitted, newest first.
pub(crate) async fn events(
    State(api): State<Api>,
    Path(pool): Path<String>,
    QueryOf(query): QueryOf<EventsQuery>,
) -> Result<Json<Value>, ApiError> {
    let pool = api.pool(&pool)?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=MAX_EVENTS).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` = {limit}: allowed are 1 to {MAX_EVENTS}")));
    }
    let events: Vec<Value> = pool
        .events
        .newest(limit)
        .await?
        .iter()
        .map(|event| {
            let mut object = serde_json::Map::new();
            object.insert("id".into(), event.id.clone().into());
            object.insert("key".into(), event.key.clone().into());
            object.insert("name".into(), event.name.clone().into());
            object.insert("created_at_ms".into(), event.created_at_ms.into());
            show_payload(&event.payload, &mut object);
            Value::Object(object)
        })
        .collect();
    Ok(Json(json!({"events": events})))
}
