//! `--max-commit-bytes` is checked against an upper bound of each change's encoded size, so
//! that encoding a commit can never fail after it was applied. Random transactions under a
//! small limit: every one that commits encodes to at most the limit, and the op that would
//! cross it is refused with `limit` naming the flag, leaving the transaction rolled back.

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::encode_commit;
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Db, ErrorCode, Limits, Retention, SchemaChange, TableSchema,
};

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn column(name: &str, ty: ColumnType) -> ColumnDef {
    ColumnDef {
        name: name.into(),
        ty,
        not_null: false,
        default: None,
    }
}

fn random_row(rng: &mut Rng, id: i64) -> Map<String, Json> {
    let text: String = "é≈x".repeat(rng.below(60) as usize);
    let big = (rng.below(u64::MAX) as i64).wrapping_mul(if rng.below(2) == 0 { 1 } else { -1 });
    let row = json!({
        "id": id,
        "n": if rng.below(4) == 0 { Json::Null } else { json!(big) },
        "r": rng.below(1000) as f64 / 7.0,
        "s": text,
        "j": {"k": [1, "two", null]},
    });
    row.as_object().unwrap().clone()
}

#[test]
fn every_committed_transaction_encodes_within_commit_bytes_max() {
    const MAX: usize = 4096;
    let seed = std::env::var("SLUICE_COMMIT_BOUND_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_c0de_u64);
    let mut rng = Rng(seed | 1);
    let limits = Limits {
        commit_bytes_max: MAX,
        ..Limits::default()
    };
    let mut db = Db::new(limits, Changelog::new(Retention::default()));
    for (name, pk_ty) in [("ints", ColumnType::Integer), ("texts", ColumnType::Text)] {
        let schema = TableSchema {
            name: name.into(),
            columns: vec![
                column("id", pk_ty),
                column("n", ColumnType::Integer),
                column("r", ColumnType::Real),
                column("s", ColumnType::Text),
                column("j", ColumnType::Json),
            ],
            pk: 0,
            indexes: vec![],
        };
        let change = SchemaChange::CreateTable {
            schema,
            if_not_exists: false,
        };
        db.apply_schema(vec![change], format!("create {name}"))
            .unwrap();
    }
    let (mut committed, mut refused, mut biggest) = (0, 0, 0);
    for step in 0..2_000 {
        let mut tx = db.transaction();
        let mut outcome = Ok(());
        for _ in 0..1 + rng.below(40) {
            let id = rng.below(200) as i64;
            let table = if rng.below(2) == 0 { "ints" } else { "texts" };
            let id_json = if table == "ints" {
                json!(id)
            } else {
                json!(format!("key-{id}"))
            };
            let mut row = random_row(&mut rng, id);
            row.insert("id".into(), id_json.clone());
            let r = match rng.below(3) {
                0 => tx.upsert(table, &row, None).map(|_| ()),
                1 => tx.delete(table, &id_json, None).map(|_| ()),
                _ => tx.insert(table, &row, None).map(|_| ()),
            };
            if let Err(e) = r {
                if e.code == ErrorCode::Limit {
                    outcome = Err(e);
                    break;
                }
            }
        }
        match outcome {
            Ok(()) => {
                if let Some(commit) = tx.commit() {
                    let mut bytes = Vec::new();
                    encode_commit(&commit, &mut bytes);
                    assert!(
                        bytes.len() <= MAX,
                        "seed {seed} step {step}: a commit of {} bytes passed a limit of {MAX}",
                        bytes.len()
                    );
                    biggest = biggest.max(bytes.len());
                    committed += 1;
                }
            }
            Err(e) => {
                assert!(e.message.contains("--max-commit-bytes"), "{}", e.message);
                let seq = tx.seq();
                drop(tx); // rolls back
                assert_eq!(db.seq + 1, seq, "a refused transaction consumes no seq");
                refused += 1;
            }
        }
    }
    assert!(
        committed > 100 && refused > 100,
        "{committed} committed, {refused} refused"
    );
    // The bound is not absurdly loose: big commits come within a factor of the limit.
    assert!(
        biggest > MAX / 3,
        "the largest commit was only {biggest} bytes"
    );
}
