//! A pool's state read straight from Redis, for tests that judge routing
//! against it rather than against a node's replica.

use std::collections::HashMap;

/// Pool `pool`'s slot table as Redis holds it: slot -> worker.
///
/// # Panics
/// When Redis does not answer.
pub async fn slot_table(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    pool: &str,
) -> HashMap<u32, String> {
    let fields: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("pulse:{{{pool}}}:map:slots"))
        .query_async(conn)
        .await
        .expect("Redis answers HGETALL");
    fields.into_iter().filter_map(|(slot, worker)| Some((slot.parse().ok()?, worker))).collect()
}
