//! Table schemas and schema changes (what DDL means, independent of SQL syntax).

use serde_json::{json, Value as Json};

use crate::value::{ColumnType, Value};

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub ty: ColumnType,
    pub not_null: bool,
    pub default: Option<Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct IndexDef {
    pub name: String,
    /// Column positions, in index key order.
    pub columns: Vec<usize>,
}

/// Aligned to a cache line of its own: a schema is shared as `Arc<TableSchema>`, and every
/// row written clones and drops that `Arc` on other threads (an op decoded on a request
/// task, its change on the writer, freed on the drop thread), so the reference counts'
/// line moves between cores all the time. At the `Arc`'s default layout the name and
/// columns sat on that same line, and each reader of them waited for it (`perf annotate`
/// of the decoder's table lookup: 57 % of its samples on loading the name).
#[derive(Clone, Debug, PartialEq)]
#[repr(align(64))]
pub struct TableSchema {
    pub name: String,
    pub columns: Vec<ColumnDef>,
    /// Position of the primary-key column (INTEGER or TEXT, never NULL).
    pub pk: usize,
    pub indexes: Vec<IndexDef>,
}

impl TableSchema {
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    pub fn pk_column(&self) -> &ColumnDef {
        &self.columns[self.pk]
    }

    pub fn to_json(&self) -> Json {
        let columns: Vec<Json> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "name": c.name,
                    "type": c.ty.as_str(),
                    "not_null": c.not_null,
                    "primary_key": i == self.pk,
                    "default": c.default.as_ref().map(Value::to_json),
                })
            })
            .collect();
        let indexes: Vec<Json> = self
            .indexes
            .iter()
            .map(|ix| {
                json!({
                    "name": ix.name,
                    "columns": ix.columns.iter().map(|&c| &self.columns[c].name).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({"name": self.name, "columns": columns, "primary_key": self.pk_column().name, "indexes": indexes})
    }
}

/// Which operations a row policy governs (`CREATE POLICY … FOR …`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyCommand {
    All,
    Select,
    Insert,
    Update,
    Delete,
}

impl PolicyCommand {
    pub const ALL: [PolicyCommand; 5] = [
        PolicyCommand::All,
        PolicyCommand::Select,
        PolicyCommand::Insert,
        PolicyCommand::Update,
        PolicyCommand::Delete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyCommand::All => "all",
            PolicyCommand::Select => "select",
            PolicyCommand::Insert => "insert",
            PolicyCommand::Update => "update",
            PolicyCommand::Delete => "delete",
        }
    }

    /// Whether a policy `FOR self` applies to `op` (one of select/insert/update/delete).
    pub fn covers(self, op: PolicyCommand) -> bool {
        self == PolicyCommand::All || self == op
    }

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<PolicyCommand> {
        PolicyCommand::ALL.get(code as usize).copied()
    }
}

/// A row policy: who may see or write which rows of its table, as SQL predicates over the
/// row and the caller's claims (`auth.<claim>`). Kept as text; the query crate compiles it.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyDef {
    pub name: String,
    pub command: PolicyCommand,
    /// `USING (…)`: which existing rows the policy lets the caller read, update or delete.
    pub using: Option<String>,
    /// `WITH CHECK (…)`: which new rows it lets the caller write.
    pub check: Option<String>,
}

impl PolicyDef {
    pub fn to_json(&self, table: &str) -> Json {
        json!({"name": self.name, "table": table, "command": self.command.as_str(),
               "using": self.using, "check": self.check})
    }
}

/// A change to the set of tables, as parsed from DDL.
#[derive(Clone, Debug, PartialEq)]
pub enum SchemaChange {
    CreateTable {
        schema: TableSchema,
        if_not_exists: bool,
    },
    CreateIndex {
        table: String,
        name: String,
        columns: Vec<String>,
        if_not_exists: bool,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    AddColumn {
        table: String,
        column: ColumnDef,
    },
    CreatePolicy {
        table: String,
        policy: PolicyDef,
    },
    DropPolicy {
        table: String,
        name: String,
        if_exists: bool,
    },
}

impl SchemaChange {
    /// The table this change is about.
    pub fn table(&self) -> &str {
        match self {
            SchemaChange::CreateTable { schema, .. } => &schema.name,
            SchemaChange::CreateIndex { table, .. } => table,
            SchemaChange::DropTable { name, .. } => name,
            SchemaChange::AddColumn { table, .. } => table,
            SchemaChange::CreatePolicy { table, .. } => table,
            SchemaChange::DropPolicy { table, .. } => table,
        }
    }
}
