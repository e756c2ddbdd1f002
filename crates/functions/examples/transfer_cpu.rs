//! CPU per `transfer` call on the writer's side, without a server: `examples/bank.js` over
//! 100 000 accounts, each call committed and its commit encoded as the writer does.
//! A robust figure on a busy machine (thread CPU time, not wall time), and a small fixed
//! workload for `valgrind --tool=callgrind`.
//!
//! `cargo run --release -p sluice-functions --example transfer_cpu -- [calls] [accounts]`

use serde_json::json;
use sluice_engine::{Changelog, Db, Limits, Retention, TxRef, TxState};
use sluice_functions::{Args, FunctionLimits, Functions, Msgpack, TxAccess};

// The allocator the server runs with, so allocation costs count as they do there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Owned {
    db: Db,
    st: TxState,
}

impl TxAccess for Owned {
    fn tx(&mut self) -> TxRef<'_> {
        self.db.tx(&mut self.st)
    }
    fn now_us(&self) -> i64 {
        1_700_000_000_000_000
    }
    fn seed(&self) -> u64 {
        7
    }
}

/// This thread's CPU time in ns (`/proc/thread-self/schedstat`, first field).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let calls: u64 = argv.next().map_or(200_000, |s| s.parse().expect("calls"));
    let accounts: u64 = argv
        .next()
        .map_or(100_000, |s| s.parse().expect("accounts"));

    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let change = sluice_sql::parse_ddl(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    )
    .unwrap()
    .remove(0)
    .change;
    db.apply_schema(vec![change], "ddl".into()).unwrap();
    let mut tx = db.transaction();
    for id in 0..accounts {
        let row = json!({"id": id, "balance": 1_000_000_000});
        tx.insert("accounts", row.as_object().unwrap(), None)
            .unwrap();
    }
    tx.commit().unwrap();

    let mut functions = Functions::new(FunctionLimits::default()).unwrap();
    functions
        .load(include_str!("../../../examples/bank.js"))
        .unwrap();

    let mut rng: u64 = 0x1234_5678;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % accounts
    };
    let mut payload = Vec::new();
    let mut frame = Vec::new();
    let mut failed = 0u64;
    let mut spare = None;
    let started = thread_cpu_ns();
    let wall = std::time::Instant::now();
    for _ in 0..calls {
        let (from, to) = (next(), next());
        // As the WebSocket reader hands them to the writer: MessagePack checked and copied
        // out of the frame (`Msgpack::read`, on the connection's task in the server).
        frame.clear();
        frame.push(0x83);
        for (key, value) in [("from", from), ("to", to), ("amount", 1)] {
            frame.push(0xa0 | key.len() as u8);
            frame.extend_from_slice(key.as_bytes());
            frame.push(0xce);
            frame.extend_from_slice(&(value as u32).to_be_bytes());
        }
        let (args, _) = Msgpack::read(&frame, 0).expect("a transfer's arguments");
        let args = Args::Msgpack(args);
        // As the writer does: the last call's transaction state, renewed.
        let st = db.begin_with(spare.take());
        let (mut owned, result) = functions.call_args("transfer", &args, None, Owned { db, st });
        match result {
            Ok(_) => {
                if let Some(commit) = owned.db.commit_state(&mut owned.st) {
                    payload.clear();
                    sluice_engine::codec::encode_commit(&commit, &mut payload);
                }
            }
            Err(_) => {
                failed += 1;
                owned.db.rollback_state(&mut owned.st);
            }
        }
        db = owned.db;
        spare = Some(owned.st);
    }
    let cpu_ns = thread_cpu_ns() - started;
    println!(
        "{calls} transfer calls ({failed} refused) over {accounts} accounts: {:.2} µs CPU per call ({:.2} µs wall)",
        cpu_ns as f64 / 1e3 / calls as f64,
        wall.elapsed().as_secs_f64() * 1e6 / calls as f64
    );
}
