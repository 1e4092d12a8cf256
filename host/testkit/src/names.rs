//! Unique names per test, and the leak check over them.
//!
//! Every Redis key pulse-host writes contains the name of its pool, map or
//! stream. A test that names those after [`unique`] can find every key it
//! left behind by that name, on a server other tests use at the same time.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::MultiplexedConnection;

/// A name no other test (of this or a concurrent process) uses: `base`,
/// reduced to lowercase letters, digits and `-`, then the process id and a
/// six-digit counter. Safe inside Redis keys, hash tags and glob patterns.
///
/// The counter has a fixed width so that no name is a prefix of another
/// (`t-42-000001` against `t-42-000012`): the leak check matches names as
/// substrings.
pub fn unique(base: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base: String =
        base.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{base}-{}-{n:06}", std::process::id())
}

/// Every key whose name contains `name`, sorted.
///
/// # Panics
/// When Redis does not answer.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn keys_under(conn: &mut MultiplexedConnection, name: &str) -> Vec<String> {
    let pattern = format!("*{name}*");
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap_or_else(|err| panic!("failed to scan keys matching {pattern:?}: {err}"));
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    keys
}

/// The leak check: panics, listing each key with its type and time to
/// live, when any key whose name contains `name` remains.
///
/// # Panics
/// When keys remain, or Redis does not answer.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn assert_no_keys(conn: &mut MultiplexedConnection, name: &str) {
    let keys = keys_under(conn, name).await;
    if keys.is_empty() {
        return;
    }
    let mut report = String::new();
    for key in &keys {
        let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap_or_default();
        let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap_or(-3);
        let ttl = if ttl >= 0 { format!("{ttl} ms") } else { "no expiry".to_owned() };
        report.push_str(&format!("\n  {key} ({kind}, {ttl})"));
    }
    panic!("{} key(s) under {name:?} were left behind:{report}", keys.len());
}
