//! Client commands against a pool's Redis: `events` reads every entry up
//! to the newest at the call, `dispatch --from-file` reports what it knows
//! when Redis fails mid-batch, read-only commands leave no trace.

use pulse_testkit::RedisServer;

use crate::{cli, write_config};

#[test]
fn events_without_follow_prints_every_entry_up_to_the_newest() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &[], "");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    const EVENTS: usize = 12_345;
    rt.block_on(async {
        let mut conn = server.connect().await;
        // As the pool's emit script writes them: entries n, p, t.
        for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("XADD")
                    .arg(pulse_streams::stream_key("many", "events"))
                    .arg("*")
                    .arg("n")
                    .arg("emit")
                    .arg("p")
                    .arg(format!("payload {i}"))
                    .arg("t")
                    .arg(format!("job-{}", i % 7))
                    .ignore();
            }
            pipe.exec_async(&mut conn).await.unwrap();
        }
    });
    let (code, out) = cli(&config, Some(server.url()), &["events", "--pool", "many", "--json"]);
    assert_eq!(code, 0);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), EVENTS, "every event, once");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["payload"], format!("payload {i}"), "in order");
        assert_eq!(line["key"], format!("job-{}", i % 7));
    }
    // Read-only commands neither join the pool nor leave anything behind.
    let (code, out) = cli(&config, Some(server.url()), &["jobs", "--pool", "many", "--json"]);
    assert_eq!((code, out.as_str()), (0, "[]"));
    rt.block_on(async {
        let mut conn = server.connect().await;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
        assert_eq!(keys, vec![pulse_streams::stream_key("many", "events")]);
    });
}
