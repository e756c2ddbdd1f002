// Throwaway probe (not committed): in-process transfer throughput through Core::call_function.
use std::time::Instant;
use serde_json::json;
use sluice_server::{Config, Core, Op};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = std::env::temp_dir().join("transfer-probe");
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = Config::new(&dir);
    config.functions_source = Some(std::fs::read_to_string("examples/bank.js").unwrap());
    let durability: sluice_log::Durability = std::env::args().nth(1).unwrap_or("memory".into()).parse().unwrap();
    config.durability = durability;
    let core = Core::open(config).unwrap();
    let sql = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)";
    core.ddl(sluice_sql::parse_ddl(sql).unwrap().into_iter().map(|d| d.change).collect(), sql.into(), None).await.unwrap();
    for chunk in 0..100 {
        let ops = (0..1000).map(|i| Op::Insert { table: "accounts".into(), row: json!({"id": chunk*1000+i, "balance": 1_000_000_000i64}).as_object().unwrap().clone(), if_version: None }).collect();
        core.mutate(ops, None).await.unwrap();
    }
    let n_tasks = 256;
    let per = 2000;
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..n_tasks {
        let core = core.clone();
        handles.push(tokio::spawn(async move {
            let mut x: u64 = t as u64 * 7919 + 1;
            for _ in 0..per {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                let from = x % 100_000; let to = (from + 1 + (x >> 20) % 99_999) % 100_000;
                core.call_function("transfer".into(), json!({"from": from, "to": to, "amount": 1}), None).await.unwrap();
            }
        }));
    }
    for h in handles { h.await.unwrap(); }
    let secs = start.elapsed().as_secs_f64();
    println!("{} transfers in {:.2}s = {:.0} TPS (commits {}, syncs {})", n_tasks*per, secs, (n_tasks*per) as f64/secs, core.commits(), core.syncs());
}
