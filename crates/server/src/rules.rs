//! Row policies applied to one row at a time (row reads, scans, catch-up, write checks),
//! compiled once per table and schema state. Queries and live views fold the read rule into
//! their plans instead (`sluice_query::prepare_as`). The model is in `docs/security.md`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Map, Value as Json};
use sluice_engine::{Change, ChangeOp, Db, Value};
use sluice_query::rules::{RowRule, TableRules};

use crate::error::CoreError;

/// Compiled rules by table, valid while the `Db`'s `schema_seq` stays.
#[derive(Default)]
pub(crate) struct RulesCache {
    tables: Mutex<HashMap<String, (u64, Arc<TableRules>)>>,
}

impl RulesCache {
    pub(crate) fn get(&self, db: &Db, table: &str) -> Result<Arc<TableRules>, CoreError> {
        let mut tables = self.tables.lock();
        if let Some((seq, rules)) = tables.get(table) {
            if *seq == db.schema_seq {
                return Ok(rules.clone());
            }
        }
        let rules = sluice_query::rules::table_rules(db, table)?;
        if tables.len() >= 4096 {
            tables.clear();
        }
        tables.insert(table.to_string(), (db.schema_seq, rules.clone()));
        Ok(rules)
    }
}

/// Whether a client with `claims` may read or write `row` under `rule`, over the state
/// `db` (a rule that cannot be evaluated allows nothing).
pub(crate) fn allows(rule: &RowRule, db: &Db, row: &[Value], claims: &Map<String, Json>) -> bool {
    rule.bind(db, claims)
        .is_ok_and(|bound| rule.allows(row, &bound))
}

/// Checks the change op `op` of a client's write made: the old row against `USING`, the new
/// one against `WITH CHECK`.
pub(crate) fn check_change(
    db: &Db,
    rules: &TableRules,
    change: &Change,
    claims: &Map<String, Json>,
    op: Option<usize>,
) -> Result<(), CoreError> {
    let table = &change.table.name;
    let refuse = |command: &'static str, rule: &RowRule, what: &str| {
        let at = op.map(|i| format!("op {i}: ")).unwrap_or_default();
        let message = if rule.policies.is_empty() {
            format!(
                "{at}{command} on {table} refused: no {} policy on {table} allows it (deny by default)",
                command.to_uppercase()
            )
        } else {
            format!(
                "{at}{command} on {table} refused: {what} of every {} policy ({})",
                command.to_uppercase(),
                rule.policies.join(", ")
            )
        };
        CoreError::Forbidden {
            message,
            op,
            command,
            target: table.clone(),
            policies: rule.policies.clone(),
        }
    };
    match change.op {
        ChangeOp::Insert => {
            let new = change.row.as_deref().expect("an insert has a row");
            if !allows(&rules.insert, db, new, claims) {
                return Err(refuse(
                    "insert",
                    &rules.insert,
                    "the new row fails WITH CHECK",
                ));
            }
        }
        ChangeOp::Update => {
            let old = change.old.as_deref().expect("an update has an old row");
            let new = change.row.as_deref().expect("an update has a row");
            if !allows(&rules.update_old, db, old, claims) {
                return Err(refuse(
                    "update",
                    &rules.update_old,
                    "the old row fails USING",
                ));
            }
            if !allows(&rules.update_new, db, new, claims) {
                return Err(refuse(
                    "update",
                    &rules.update_new,
                    "the new row fails WITH CHECK",
                ));
            }
        }
        ChangeOp::Delete => {
            let old = change.old.as_deref().expect("a delete has an old row");
            if !allows(&rules.delete, db, old, claims) {
                return Err(refuse("delete", &rules.delete, "the old row fails USING"));
            }
        }
    }
    Ok(())
}

/// A topic rule list bound to one caller: `(literal, wildcard)` patterns (`("", true)` is
/// `*`). A pattern whose claim the caller lacks (or is not a string or number) is left out.
pub(crate) fn bind_patterns(list: &[String], claims: &Map<String, Json>) -> Vec<(String, bool)> {
    use sluice_engine::topic::{rule_parts, RulePart};
    let mut out = Vec::with_capacity(list.len());
    'patterns: for p in list {
        let Ok((parts, wildcard)) = rule_parts(p) else {
            continue;
        };
        let mut text = String::new();
        for part in parts {
            match part {
                RulePart::Text(t) => text.push_str(t),
                RulePart::Claim(c) => match claims.get(c) {
                    Some(Json::String(s)) => text.push_str(s),
                    Some(Json::Number(n)) => text.push_str(&n.to_string()),
                    _ => continue 'patterns,
                },
            }
        }
        out.push((text, wildcard));
    }
    out
}

/// Whether one of `allowed` matches tag `tag`.
fn tag_allowed(allowed: &[(String, bool)], tag: &str) -> bool {
    allowed.iter().any(|(a, wild)| {
        if *wild {
            tag.starts_with(a.as_str())
        } else {
            tag == a
        }
    })
}

/// Whether every record a filter pattern (`literal`, `wildcard`) selects is within one of
/// `allowed`.
fn pattern_covered(allowed: &[(String, bool)], literal: &str, wildcard: bool) -> bool {
    allowed.iter().any(|(a, wild)| {
        if *wild {
            literal.starts_with(a.as_str())
        } else {
            !wildcard && literal == a
        }
    })
}

fn topic_refusal(topic: &str, command: &'static str, message: String) -> CoreError {
    CoreError::Forbidden {
        message,
        op: None,
        command,
        target: topic.to_string(),
        policies: Vec::new(),
    }
}

/// A client may read or watch `topic` with `filter` only if every pattern of it lies
/// within one of the topic's read rules.
pub(crate) fn check_topic_read(
    topic: &sluice_engine::Topic,
    filter: &sluice_engine::TagFilter,
    claims: &Map<String, Json>,
) -> Result<(), CoreError> {
    let allowed = bind_patterns(&topic.rules().read, claims);
    let name = topic.name();
    let refuse = |pattern: &str| {
        topic_refusal(
            name,
            "read",
            format!(
                "reading {pattern} of topic {name} is refused: no read rule of the topic covers it (rules: {:?})",
                topic.rules().read
            ),
        )
    };
    if filter.is_all() {
        if !pattern_covered(&allowed, "", true) {
            return Err(refuse("every record (no tag filter)"));
        }
        return Ok(());
    }
    for e in filter.exact() {
        if !pattern_covered(&allowed, e, false) {
            return Err(refuse(&format!("tag {e:?}")));
        }
    }
    for p in filter.prefixes() {
        if !pattern_covered(&allowed, p, true) {
            return Err(refuse(&format!("tags {:?}", format!("{p}*"))));
        }
    }
    Ok(())
}

/// A client may append a record only if each of its tags matches an append rule (a record
/// without tags needs `*`).
pub(crate) fn check_topic_append(
    topic: &sluice_engine::Topic,
    records: &[crate::topics::NewRecord],
    claims: &Map<String, Json>,
) -> Result<(), CoreError> {
    let allowed = bind_patterns(&topic.rules().append, claims);
    let name = topic.name();
    for (i, r) in records.iter().enumerate() {
        let bad = if r.tags.is_empty() {
            (!pattern_covered(&allowed, "", true)).then(|| "a record without tags".to_string())
        } else {
            r.tags
                .iter()
                .find(|t| !tag_allowed(&allowed, t))
                .map(|t| format!("tag {t:?}"))
        };
        if let Some(what) = bad {
            let mut e = topic_refusal(
                name,
                "append",
                format!(
                    "record {i}: appending {what} to topic {name} is refused: no append rule of the topic allows it (rules: {:?})",
                    topic.rules().append
                ),
            );
            if let CoreError::Forbidden { op, .. } = &mut e {
                *op = Some(i);
            }
            return Err(e);
        }
    }
    Ok(())
}
