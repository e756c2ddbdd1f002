//! An idle scoped view costs little: the live registry's own allocations per view (the view,
//! its kept rows' keys and sort values, routes, sharing key, subscriber entry and sink) stay
//! under a budget that leaves room, inside the 2 KiB per idle view the product promises, for
//! the transport's per-subscription state. Counted with a counting global allocator, so the
//! number is exact and does not depend on the machine's load.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use serde_json::json;
use sluice_engine::{Changelog, Db, Limits, Retention};
use sluice_live::{Live, Sink, Subscribe};
use sluice_query::Params;

struct Counting;
static ALLOCATED_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const ROOMS: i64 = 5_000;
const ROWS_PER_ROOM: i64 = 3;
/// The registry's share of the 2 KiB per idle view.
const REGISTRY_BYTES_PER_VIEW_MAX: isize = 1_400;

#[test]
fn an_idle_scoped_view_costs_the_registry_under_its_budget() {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let ddl = "CREATE TABLE msg (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, author INTEGER NOT NULL, ts INTEGER NOT NULL, body TEXT); CREATE INDEX msg_room ON msg (room)";
    let changes = sluice_sql::parse_ddl(ddl)
        .unwrap()
        .into_iter()
        .map(|d| d.change)
        .collect();
    db.apply_schema(changes, ddl.into()).unwrap();
    let mut tx = db.transaction();
    for id in 0..ROOMS * ROWS_PER_ROOM {
        let row =
            json!({"id": id, "room": id / ROWS_PER_ROOM, "author": 0, "ts": id, "body": "hello"});
        tx.upsert("msg", row.as_object().unwrap(), None).unwrap();
    }
    tx.commit().unwrap();

    let mut live = Live::new(sluice_live::Limits::default());
    let sql = "SELECT * FROM msg WHERE room = $1 ORDER BY ts DESC LIMIT 20";
    let subscribe = |live: &mut Live, room: i64| {
        let sink = Sink::new(live.limits());
        let req = Subscribe {
            sql: sql.into(),
            params: Params::from_json(Some(&json!([room]))).unwrap(),
            since: None,
            claims: None,
        };
        live.subscribe(&db, &req, sink.clone()).unwrap();
        // The transport takes the snapshot at once; then the view is idle.
        let snapshot = sink.try_recv().expect("a snapshot");
        assert!(snapshot.json.contains("\"keys\":["));
        sink
    };
    // The plan and the registry's first allocations are shared by every view.
    let mut sinks = vec![subscribe(&mut live, 0)];
    let before = ALLOCATED_BYTES.load(Ordering::Relaxed);
    for room in 1..ROOMS {
        sinks.push(subscribe(&mut live, room));
    }
    let per_view = (ALLOCATED_BYTES.load(Ordering::Relaxed) - before) / (ROOMS - 1) as isize;
    eprintln!("{per_view} bytes allocated per idle view ({ROWS_PER_ROOM} rows each, shared with the table)");
    assert_eq!(live.stats().views, ROOMS as usize);
    assert_eq!(live.view_rows_of(sql), Some(ROWS_PER_ROOM as usize));
    assert!(
        per_view < REGISTRY_BYTES_PER_VIEW_MAX,
        "an idle view costs {per_view} bytes; the budget is {REGISTRY_BYTES_PER_VIEW_MAX}"
    );
}
