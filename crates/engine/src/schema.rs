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

#[derive(Clone, Debug, PartialEq)]
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
}

impl SchemaChange {
    /// The table this change is about.
    pub fn table(&self) -> &str {
        match self {
            SchemaChange::CreateTable { schema, .. } => &schema.name,
            SchemaChange::CreateIndex { table, .. } => table,
            SchemaChange::DropTable { name, .. } => name,
            SchemaChange::AddColumn { table, .. } => table,
        }
    }
}
