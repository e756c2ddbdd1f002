//! One table: rows by primary key, plus its secondary indexes.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::cow::CowMap;
use crate::schema::TableSchema;
use crate::value::{Key, Value};

/// A stored row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowEntry {
    /// One value per schema column. Invariant: `values.len() == schema.columns.len()`.
    pub values: Arc<[Value]>,
    /// The seq of the commit that last wrote this row: it grows with every commit that
    /// writes the row and never repeats for a key, even across a delete and a re-insert
    /// (`if_version` cannot be fooled by an old version: no ABA), and a point read that
    /// finds the row waits for no later commit than this one. Kept as written (log records
    /// and snapshots carry it), so recovery restores it exactly.
    pub version: u64,
}

// An entry of every table's row map: its size is per row of memory.
const _: () = assert!(std::mem::size_of::<(Key, RowEntry)>() == 40);

/// Entries of a secondary index: the indexed values, then the primary key (so entries are
/// unique and ordered by key within equal values).
pub type IndexEntries = BTreeSet<(Box<[Value]>, Key)>;

#[derive(Clone, Debug)]
pub struct Table {
    pub schema: Arc<TableSchema>,
    /// Rows by primary key. Copy on write by chunk: a clone is a frozen version (what a
    /// snapshot encodes off the writer thread) and costs O(rows / chunk size).
    pub rows: CowMap<Key, RowEntry>,
    /// `indexes[i]` holds the entries of `schema.indexes[i]`.
    pub indexes: Vec<IndexEntries>,
    /// Row policies (`CREATE POLICY`), in creation order; names are unique.
    pub policies: Vec<crate::schema::PolicyDef>,
}

impl Table {
    pub fn new(schema: Arc<TableSchema>) -> Self {
        let indexes = schema.indexes.iter().map(|_| IndexEntries::new()).collect();
        Table {
            schema,
            rows: CowMap::new(),
            indexes,
            policies: Vec::new(),
        }
    }

    fn index_key(&self, index: usize, values: &[Value]) -> Box<[Value]> {
        self.schema.indexes[index]
            .columns
            .iter()
            .map(|&c| values[c].clone())
            .collect()
    }

    /// Stores `entry` under `key`, keeping indexes in step; returns the previous entry.
    pub fn put(&mut self, key: Key, entry: RowEntry) -> Option<RowEntry> {
        debug_assert_eq!(entry.values.len(), self.schema.columns.len());
        for i in 0..self.indexes.len() {
            let ik = self.index_key(i, &entry.values);
            self.indexes[i].insert((ik, key.clone()));
        }
        let old = self.rows.insert(key.clone(), entry);
        if let Some(old) = &old {
            for i in 0..self.indexes.len() {
                let old_ik = self.index_key(i, &old.values);
                let new_ik = self.index_key(i, &self.rows[&key].values);
                if old_ik != new_ik {
                    self.indexes[i].remove(&(old_ik, key.clone()));
                }
            }
        }
        old
    }

    /// Removes the row under `key`, keeping indexes in step.
    pub fn remove(&mut self, key: &Key) -> Option<RowEntry> {
        let old = self.rows.remove(key)?;
        for i in 0..self.indexes.len() {
            let ik = self.index_key(i, &old.values);
            self.indexes[i].remove(&(ik, key.clone()));
        }
        Some(old)
    }

    /// Fills an empty table from rows in strictly ascending key order (snapshot loading):
    /// the row map and every index are built in bulk.
    pub fn load_sorted(&mut self, rows: Vec<(Key, RowEntry)>) {
        self.load_map(CowMap::from_sorted(rows));
    }

    /// Fills an empty table with the row map `rows` (built in bulk, e.g. with a
    /// [`crate::cow::CowMapBuilder`]); every index is built from it.
    pub fn load_map(&mut self, rows: CowMap<Key, RowEntry>) {
        assert!(self.rows.is_empty(), "load_map fills an empty table");
        self.rows = rows;
        for i in 0..self.indexes.len() {
            let entries: IndexEntries = self
                .rows
                .iter()
                .map(|(key, row)| (self.index_key(i, &row.values), key.clone()))
                .collect();
            self.indexes[i] = entries;
        }
    }

    /// Adds an index over existing rows.
    pub fn add_index(&mut self, schema: Arc<TableSchema>) {
        self.schema = schema;
        let i = self.indexes.len();
        assert_eq!(i + 1, self.schema.indexes.len(), "one new index at a time");
        let mut entries = IndexEntries::new();
        for (key, row) in &self.rows {
            entries.insert((self.index_key(i, &row.values), key.clone()));
        }
        self.indexes.push(entries);
    }

    /// Appends a column to every row with `fill` (the new column's default or NULL).
    pub fn add_column(&mut self, schema: Arc<TableSchema>, fill: &Value) {
        self.schema = schema;
        for row in self.rows.values_mut() {
            let mut values: Vec<Value> = row.values.to_vec();
            values.push(fill.clone());
            row.values = values.into();
        }
    }
}
