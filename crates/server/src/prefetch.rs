//! Key hints: the writer learns which arguments of a server function name the rows it
//! writes, and brings those rows into the cache for the calls queued behind the one it runs.
//!
//! *Why.* The writer applies calls one at a time, and a call's first `tx.get` of a row that
//! is not cached waits for memory twice: for the row map's entry, then for the row's values
//! (~190 ns each on this project's VM). In `sluice bench transfer` at α = 0 (100 000
//! accounts, each transfer two random ones) those waits were a quarter of the writer's time
//! (`perf annotate`: three quarters of `CowMap::get` on the entry's first load, most of
//! `js_of` on the values), and the writer is the bottleneck there. The rows a queued call
//! will read are usually named by its arguments (`transfer(tx, {from, to, amount})`), so
//! while call *n* runs, the entries of call *n + 2* are prefetched, and the values of call
//! *n + 1* (its entries are cached by then, so finding them costs no wait).
//!
//! *How it learns.* After a call commits, each top-level argument field whose value (an
//! integer, or text) equals the key of a row the commit changed becomes a hint (field →
//! table), for the first [`LEARN_CALLS`] commits of each function; hints are never used for
//! anything but a prefetch, so a wrong one costs a wasted cache line and nothing else. A
//! function that reads rows it does not write, or takes its keys from elsewhere, learns
//! nothing and is simply not helped. Reloading the functions forgets every hint.
//!
//! Limits: [`FUNCTIONS_MAX`] functions, [`HINTS_PER_FUNCTION_MAX`] hints each, keys of at
//! most [`KEY_BYTES_MAX`] bytes of text.

use std::collections::HashMap;

use serde_json::Value as Json;
use sluice_engine::cow::prefetch_line;
use sluice_engine::{Commit, CommitBody, Db, Key};
use sluice_functions::msgpack::{Reader, Token};
use sluice_functions::Args;

/// Commits of a function that teach hints; later ones only use them.
pub(crate) const LEARN_CALLS: u32 = 64;
/// Functions that keep hints (others are not helped).
pub(crate) const FUNCTIONS_MAX: usize = 1024;
/// Hints kept per function.
pub(crate) const HINTS_PER_FUNCTION_MAX: usize = 4;
/// Longest text argument taken as a key to prefetch.
pub(crate) const KEY_BYTES_MAX: usize = 256;

/// One learned hint: the argument field `field` is a key of `table`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hint {
    pub field: Box<[u8]>,
    pub table: Box<str>,
}

#[derive(Default)]
struct Learned {
    commits_seen: u32,
    hints: Vec<Hint>,
}

/// Which prefetch a queued call gets (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Two calls ahead: the row map's entry.
    Entry,
    /// The next call: the row's values (its entry was prefetched one call before).
    Values,
}

#[derive(Default)]
pub(crate) struct KeyHints {
    by_function: HashMap<Box<str>, Learned>,
}

/// A top-level argument field whose value could be a key.
fn key_of(token: Token<'_>) -> Option<Key> {
    match token {
        Token::Int(i) => Some(Key::Int(i)),
        Token::Str(s) if s.len() <= KEY_BYTES_MAX => {
            std::str::from_utf8(s).ok().map(|s| Key::Text(s.into()))
        }
        _ => None,
    }
}

fn key_of_json(json: &Json) -> Option<Key> {
    match json {
        Json::Number(n) => n.as_i64().map(Key::Int),
        Json::String(s) if s.len() <= KEY_BYTES_MAX => Some(Key::Text(s.as_str().into())),
        _ => None,
    }
}

/// Calls `f` with each top-level field of `args` (an object) whose value could be a key;
/// stops early if `f` says so. Arguments that are not an object have no fields.
fn for_each_key_field(args: &Args, mut f: impl FnMut(&[u8], Key) -> bool) {
    match args {
        Args::Json(Json::Object(map)) => {
            for (name, value) in map {
                if let Some(key) = key_of_json(value) {
                    if !f(name.as_bytes(), key) {
                        return;
                    }
                }
            }
        }
        Args::Json(_) => {}
        Args::Msgpack(m) => {
            let mut r = Reader::new(m.bytes());
            let Some(Token::Map(n)) = r.token() else {
                return;
            };
            for _ in 0..n {
                let Some(Token::Str(name)) = r.token() else {
                    return;
                };
                let at = r.position();
                let Some(token) = r.token() else {
                    return;
                };
                if let Some(key) = key_of(token) {
                    if !f(name, key) {
                        return;
                    }
                } else {
                    // Skips the whole value (an array or map is more than one token).
                    r.seek(at);
                    if r.check_value().is_none() {
                        return;
                    }
                }
            }
        }
    }
}

impl KeyHints {
    /// The hints learned for `function` so far.
    pub(crate) fn hints(&self, function: &str) -> &[Hint] {
        self.by_function
            .get(function)
            .map_or(&[], |l| l.hints.as_slice())
    }

    /// Forgets every hint (the functions were reloaded).
    pub(crate) fn clear(&mut self) {
        self.by_function.clear();
    }

    /// Learns from `commit`, made by a call of `function` with `args`.
    pub(crate) fn learn(&mut self, function: &str, args: &Args, commit: &Commit) {
        if !self.by_function.contains_key(function) {
            if self.by_function.len() >= FUNCTIONS_MAX {
                return;
            }
            self.by_function.insert(function.into(), Learned::default());
        }
        let learned = self
            .by_function
            .get_mut(function)
            .expect("inserted above if it was missing");
        if learned.commits_seen >= LEARN_CALLS {
            return;
        }
        learned.commits_seen += 1;
        let CommitBody::Rows(changes) = &commit.body else {
            return;
        };
        for_each_key_field(args, |field, key| {
            for change in changes.iter().filter(|c| c.key == key) {
                let hint = Hint {
                    field: field.into(),
                    table: change.table.name.as_str().into(),
                };
                if !learned.hints.contains(&hint) {
                    learned.hints.push(hint);
                }
                if learned.hints.len() >= HINTS_PER_FUNCTION_MAX {
                    return false;
                }
            }
            true
        });
    }

    /// Prefetches, at `stage`, the rows a queued call of `function` with `args` is expected
    /// to read. Changes nothing but what the CPU caches.
    pub(crate) fn prefetch(&self, db: &Db, function: &str, args: &Args, stage: Stage) {
        let hints = self.hints(function);
        if hints.is_empty() {
            return;
        }
        for_each_key_field(args, |field, key| {
            for hint in hints.iter().filter(|h| *h.field == *field) {
                let Ok(table) = db.table(&hint.table) else {
                    continue;
                };
                match stage {
                    Stage::Entry => table.rows.prefetch(&key),
                    Stage::Values => {
                        if let Some(row) = table.rows.get(&key) {
                            prefetch_line(row.values.as_ptr());
                        }
                    }
                }
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_engine::TableSchema;
    use sluice_engine::{Changelog, ColumnDef, ColumnType, Limits, Retention, SchemaChange};

    fn db_with_accounts(n: i64) -> Db {
        let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
        let column = |name: &str| ColumnDef {
            name: name.into(),
            ty: ColumnType::Integer,
            not_null: false,
            default: None,
        };
        let schema = TableSchema {
            name: "accounts".into(),
            columns: vec![column("id"), column("balance")],
            pk: 0,
            indexes: vec![],
        };
        let change = SchemaChange::CreateTable {
            schema,
            if_not_exists: false,
        };
        db.apply_schema(vec![change], "create accounts".into())
            .unwrap();
        let mut tx = db.transaction();
        for id in 0..n {
            let row = json!({"id": id, "balance": 100});
            tx.insert("accounts", row.as_object().unwrap(), None)
                .unwrap();
        }
        tx.commit();
        db
    }

    /// Sets the balance of each of `ids`, committed: the commit it made.
    fn patch_all(db: &mut Db, ids: &[i64]) -> std::sync::Arc<Commit> {
        let mut tx = db.transaction();
        for &id in ids {
            let set = json!({"balance": 99});
            tx.patch("accounts", &json!(id), set.as_object().unwrap(), None)
                .unwrap();
        }
        tx.commit().expect("the patches wrote rows")
    }

    fn transfer(db: &mut Db, from: i64, to: i64) -> std::sync::Arc<Commit> {
        patch_all(db, &[from, to])
    }

    fn hint(field: &str, table: &str) -> Hint {
        Hint {
            field: field.as_bytes().into(),
            table: table.into(),
        }
    }

    #[test]
    fn argument_fields_that_name_the_written_rows_become_hints() {
        let mut db = db_with_accounts(10);
        let mut hints = KeyHints::default();
        let args = Args::from(json!({"from": 3, "to": 7, "amount": 1, "memo": "x"}));
        let commit = transfer(&mut db, 3, 7);
        hints.learn("transfer", &args, &commit);
        assert_eq!(
            hints.hints("transfer"),
            &[hint("from", "accounts"), hint("to", "accounts")]
        );
        // The same over MessagePack arguments, with a nested value to skip.
        let packed =
            rmp_serde::to_vec_named(&json!({"nested": [1, {"a": 2}], "to": 5, "from": 4})).unwrap();
        let packed = Args::Msgpack(sluice_functions::Msgpack::checked(packed).unwrap());
        let commit = transfer(&mut db, 4, 5);
        let mut fresh = KeyHints::default();
        fresh.learn("transfer", &packed, &commit);
        assert_eq!(
            fresh.hints("transfer"),
            &[hint("to", "accounts"), hint("from", "accounts")]
        );
    }

    #[test]
    fn fields_that_match_no_written_key_teach_nothing_and_learning_stops() {
        let mut db = db_with_accounts(10);
        let mut hints = KeyHints::default();
        // `amount` equals no key written; a text field matches no integer key.
        let args = Args::from(json!({"amount": 9, "memo": "3"}));
        for _ in 0..LEARN_CALLS {
            let commit = transfer(&mut db, 3, 7);
            hints.learn("transfer", &args, &commit);
        }
        assert!(hints.hints("transfer").is_empty());
        // Past LEARN_CALLS commits, nothing more is learned.
        let commit = transfer(&mut db, 3, 7);
        hints.learn("transfer", &Args::from(json!({"from": 3})), &commit);
        assert!(hints.hints("transfer").is_empty());
        hints.clear();
        hints.learn("transfer", &Args::from(json!({"from": 3})), &commit);
        assert_eq!(hints.hints("transfer"), &[hint("from", "accounts")]);
    }

    #[test]
    fn hints_are_bounded_per_function_and_in_functions() {
        let mut db = db_with_accounts(10);
        let commit = patch_all(&mut db, &[0, 1, 2, 3, 4, 5, 6, 7]);
        let fields: serde_json::Map<String, Json> =
            (0..8).map(|i| (format!("k{i}"), json!(i))).collect();
        let args = Args::from(Json::Object(fields));
        let mut hints = KeyHints::default();
        hints.learn("many", &args, &commit);
        assert_eq!(hints.hints("many").len(), HINTS_PER_FUNCTION_MAX);
        for f in 0..FUNCTIONS_MAX + 5 {
            hints.learn(&format!("f{f}"), &args, &commit);
        }
        assert_eq!(hints.by_function.len(), FUNCTIONS_MAX);
    }

    #[test]
    fn prefetching_changes_nothing_whatever_the_arguments() {
        let mut db = db_with_accounts(1000);
        let mut hints = KeyHints::default();
        let commit = transfer(&mut db, 3, 7);
        hints.learn(
            "transfer",
            &Args::from(json!({"from": 3, "to": 7})),
            &commit,
        );
        let before: Vec<_> = db
            .table("accounts")
            .unwrap()
            .rows
            .iter()
            .map(|(k, r)| (k.clone(), r.values.to_vec(), r.version))
            .collect();
        let argss = [
            json!({"from": 3, "to": 999}),
            json!({"from": -5, "to": 1_000_000}),
            json!({"from": "text", "to": null}),
            json!([1, 2]),
            json!(7),
            json!({"from": i64::MAX, "to": i64::MIN}),
        ];
        for args in argss {
            for stage in [Stage::Entry, Stage::Values] {
                hints.prefetch(&db, "transfer", &Args::from(args.clone()), stage);
                hints.prefetch(&db, "unknown", &Args::from(args.clone()), stage);
            }
        }
        // A table the hints name that is gone is passed over.
        let empty = Db::new(Limits::default(), Changelog::new(Retention::default()));
        hints.prefetch(
            &empty,
            "transfer",
            &Args::from(json!({"from": 3})),
            Stage::Values,
        );
        let after: Vec<_> = db
            .table("accounts")
            .unwrap()
            .rows
            .iter()
            .map(|(k, r)| (k.clone(), r.values.to_vec(), r.version))
            .collect();
        assert_eq!(before, after);
    }
}
