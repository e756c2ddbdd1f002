//! A fixed ingest workload for instruction counts (`valgrind --tool=callgrind`): `batches`
//! mutate bodies of `rows` `events` rows each (the rows `sluice bench ingest` sends) are
//! decoded by `Core::decode_mutate`, as `POST /v1/mutate` does, and applied by the writer
//! (`memory` class, so no disk). Divide a function's inclusive count by the rows:
//! `sluice_server::decode::decode_mutate` is the request side, `sluice_server::writer::
//! apply_mutate` the writer's apply, `sluice_server::writer::Writer::round` the writer's
//! whole round (apply, frame encoding, changelog, log submit).
//!
//! `cargo build --release -p sluice-server --example ingest_cpu`, then
//! `valgrind --tool=callgrind target/release/examples/ingest_cpu [batches] [rows] [msgpack]`;
//! with `msgpack`, each body goes as the WebSocket `mutate` request in MessagePack
//! (`Core::decode_ws_mutate`; its encoding is outside the count only if you subtract
//! `rmp_serde::encode`).

use std::fmt::Write;

use sluice_log::Durability;
use sluice_server::{Caller, Config, Core};

// The allocator the server runs with, so allocation costs count as they do there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn body(first: u64, rows: u64) -> String {
    const TEXT: &str = "the quick brown fox jumps over the lazy dog while the sluice keeps every write in order and durable; pack my box with five dozen liquor jugs";
    let mut out = String::from("{\"ops\":[");
    for id in first..first + rows {
        if id > first {
            out.push(',');
        }
        let start = (id % 40) as usize;
        write!(
            out,
            "{{\"op\":\"insert\",\"table\":\"events\",\"row\":{{\"id\":{id},\"room\":\"room-{}\",\"author\":\"user-{}\",\"body\":\"{}\",\"ts\":{}}}}}",
            id % 1000,
            id % 10_000,
            &TEXT[start..start + 100],
            1_700_000_000_000_000 + id * 1000
        )
        .expect("a String takes any text");
    }
    out.push_str("]}");
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let batches: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let rows: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let msgpack = args.next().as_deref() == Some("msgpack");
    let dir = std::env::temp_dir().join(format!("sluice-ingest-cpu-{}", std::process::id()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut config = Config::new(&dir);
    config.durability = Durability::Memory;
    let core = Core::open(config).expect("open");
    runtime.block_on(async {
        let sql = "CREATE TABLE events (id INTEGER PRIMARY KEY, room TEXT NOT NULL, author TEXT, body TEXT, ts INTEGER)";
        let changes = sluice_sql::parse_ddl(sql)
            .expect("the DDL parses")
            .into_iter()
            .map(|d| d.change)
            .collect();
        core.ddl(changes, sql.into(), None).await.expect("the DDL");
        for b in 0..batches {
            let text = body(b * rows, rows);
            let decoded = if msgpack {
                // The WebSocket request the TypeScript SDK sends by default.
                let mut request: serde_json::Value =
                    serde_json::from_str(&text).expect("the body is JSON");
                request["type"] = "mutate".into();
                request["id"] = b.into();
                let frame = rmp_serde::to_vec_named(&request).expect("encodes");
                let kept = sluice_server::decode::KeptBody::Msgpack(frame.into());
                core.decode_ws_mutate(kept)
                    .expect("the typed decoder takes these rows")
                    .1
            } else {
                core.decode_mutate(axum::body::Bytes::from(text))
                    .expect("the typed decoder takes these rows")
            };
            let ok = core
                .mutate_decoded_as(&Caller::Admin, decoded)
                .await
                .expect("the mutate commits");
            std::hint::black_box(serde_json::to_vec(&ok.results.len()).expect("prints"));
        }
    });
    drop(core);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let _ = std::fs::remove_dir_all(&dir);
    println!("{} rows in {batches} mutates", batches * rows);
}
