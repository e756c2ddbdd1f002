import { useCallback, useEffect, useState } from "react";
import { Api, Column, Row, Table, describeError, ident } from "./api";
import { draftOf, isoOfMicros, parseValue, show, toCsv } from "./values";

export function TablesView({ api }: { api: Api }) {
  const [tables, setTables] = useState<Table[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [sel, setSel] = useState<string | null>(null);
  const load = useCallback(() => {
    api
      .tables()
      .then((r) => {
        setTables(r.tables);
        setError(null);
        setSel((s) => (s && r.tables.some((t) => t.name === s) ? s : (r.tables[0]?.name ?? null)));
      })
      .catch((e) => setError(describeError(e)));
  }, [api]);
  useEffect(load, [load]);
  const table = tables?.find((t) => t.name === sel) ?? null;
  return (
    <div className="split">
      <aside>
        <div className="aside-head">
          <b>Tables</b>
          <button className="link" onClick={load} title="reload the list">
            ↻
          </button>
        </div>
        {error && <div className="error">{error}</div>}
        {tables?.length === 0 && <div className="muted">No tables yet: create one in the SQL tab.</div>}
        <ul className="list">
          {tables?.map((t) => (
            <li key={t.name}>
              <button className={t.name === sel ? "item active" : "item"} onClick={() => setSel(t.name)} data-table={t.name}>
                {t.name} <span className="muted">{t.columns.length} cols</span>
              </button>
            </li>
          ))}
        </ul>
      </aside>
      <section className="grow">{table && <TableDetail key={table.name} api={api} table={table} />}</section>
    </div>
  );
}

function Schema({ table }: { table: Table }) {
  return (
    <details className="schema" open>
      <summary>
        Schema of <b>{table.name}</b> (primary key <code>{table.primary_key}</code>)
      </summary>
      <table className="grid small">
        <thead>
          <tr>
            <th>column</th>
            <th>type</th>
            <th>not null</th>
            <th>default</th>
          </tr>
        </thead>
        <tbody>
          {table.columns.map((c) => (
            <tr key={c.name}>
              <td>
                {c.name} {c.primary_key && <span className="badge">PK</span>}
              </td>
              <td>{c.type}</td>
              <td>{c.not_null ? "yes" : ""}</td>
              <td>{c.default === null || c.default === undefined ? "" : show(c.default)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {table.indexes.length > 0 && (
        <div className="muted">
          Indexes: {table.indexes.map((i) => (typeof i === "string" ? i : JSON.stringify(i))).join("; ")}
        </div>
      )}
    </details>
  );
}

const PAGE_SIZES = [25, 50, 100, 500, 1000];
const EXPORT_PAGE = 1000;

type Loaded = { rows: { row: Row; version: number | null }[]; next: unknown; seq: number; filter: string };

function TableDetail({ api, table }: { api: Api; table: Table }) {
  const pk = table.primary_key;
  const cols = table.columns;
  const [pageSize, setPageSize] = useState(50);
  const [filterText, setFilterText] = useState("");
  const [filter, setFilter] = useState("");
  const [afters, setAfters] = useState<unknown[]>([undefined]);
  const [page, setPage] = useState<Loaded | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [editing, setEditing] = useState<{ id: unknown; col: string; draft: string } | null>(null);
  const [cellError, setCellError] = useState<{ id: unknown; col: string; message: string } | null>(null);
  const [rowError, setRowError] = useState<string | null>(null);
  const [insert, setInsert] = useState<Record<string, string> | null>(null);
  const [exporting, setExporting] = useState<string | null>(null);
  const after = afters[afters.length - 1];

  const load = useCallback(async () => {
    try {
      if (filter.trim()) {
        const cond = after === undefined ? "" : ` AND ${ident(pk)} > $1`;
        const sql = `SELECT * FROM ${ident(table.name)} WHERE (${filter})${cond} ORDER BY ${ident(pk)} LIMIT ${pageSize + 1}`;
        const r = await api.query(sql, after === undefined ? undefined : [after]);
        const more = r.rows.length > pageSize;
        const rows = r.rows.slice(0, pageSize);
        setPage({ rows: rows.map((row) => ({ row, version: null })), next: more ? rows[rows.length - 1][pk] : null, seq: r.seq, filter });
      } else {
        const r = await api.rows(table.name, after, pageSize);
        setPage({ rows: r.rows, next: r.next, seq: r.seq, filter: "" });
      }
      setError(null);
    } catch (e) {
      setError(describeError(e));
      setPage(null);
    }
  }, [api, table.name, pk, filter, after, pageSize]);
  useEffect(() => {
    void load();
  }, [load]);

  /** Writes the edited cell with a `patch`; `setNull` writes NULL whatever the draft says. */
  const save = async (setNull = false) => {
    if (!editing) return;
    const col = cols.find((c) => c.name === editing.col)!;
    let value: unknown = null;
    try {
      if (!setNull) value = parseValue(editing.draft, col.type, !col.not_null);
    } catch (e) {
      setCellError({ id: editing.id, col: editing.col, message: (e as Error).message });
      return;
    }
    try {
      await api.mutate([{ op: "patch", table: table.name, id: editing.id, set: { [editing.col]: value } }]);
      setEditing(null);
      setCellError(null);
      await load();
    } catch (e) {
      setCellError({ id: editing.id, col: editing.col, message: describeError(e) });
    }
  };

  const remove = async (id: unknown) => {
    if (!window.confirm(`Delete the row ${show(id)} of ${table.name}?`)) return;
    try {
      await api.mutate([{ op: "delete", table: table.name, id }]);
      setRowError(null);
      await load();
    } catch (e) {
      setRowError(describeError(e));
    }
  };

  const doInsert = async () => {
    if (!insert) return;
    const row: Row = {};
    try {
      for (const c of cols) {
        const text = insert[c.name] ?? "";
        if (text === "") continue; // omitted: the column's default
        row[c.name] = parseValue(text, c.type, !c.not_null);
      }
    } catch (e) {
      setRowError(`insert: ${(e as Error).message}`);
      return;
    }
    try {
      await api.mutate([{ op: "insert", table: table.name, row }]);
      setInsert(null);
      setRowError(null);
      await load();
    } catch (e) {
      setRowError(`insert: ${describeError(e)}`);
    }
  };

  const exportAll = async (format: "csv" | "json") => {
    const all: Row[] = [];
    let cursor: unknown = undefined;
    try {
      setExporting(`exporting… 0 rows`);
      for (;;) {
        const r = await api.rows(table.name, cursor, EXPORT_PAGE);
        for (const x of r.rows) all.push(x.row);
        setExporting(`exporting… ${all.length} rows`);
        if (r.next === null || r.next === undefined || r.rows.length === 0) break;
        cursor = r.next;
      }
      const names = cols.map((c) => c.name);
      const text = format === "csv" ? toCsv(names, all) : JSON.stringify(all, null, 1) + "\n";
      const blob = new Blob([text], { type: format === "csv" ? "text/csv" : "application/json" });
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = `${table.name}.${format}`;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
      setExporting(`exported ${all.length} rows as ${format.toUpperCase()}`);
    } catch (e) {
      setExporting(`export failed after ${all.length} rows: ${describeError(e)}`);
    }
  };

  const pageNo = afters.length;
  return (
    <div>
      <Schema table={table} />
      <div className="toolbar">
        <form
          className="filter"
          onSubmit={(e) => {
            e.preventDefault();
            setFilter(filterText);
            setAfters([undefined]);
          }}
        >
          <code>WHERE</code>
          <input
            name="filter"
            placeholder="a filter, e.g. body LIKE '%hi%' AND id > 10"
            value={filterText}
            onChange={(e) => setFilterText(e.target.value)}
          />
          <button type="submit">Filter</button>
          {filter && (
            <button
              type="button"
              onClick={() => {
                setFilter("");
                setFilterText("");
                setAfters([undefined]);
              }}
            >
              Clear
            </button>
          )}
        </form>
        <label>
          rows per page{" "}
          <select
            value={pageSize}
            onChange={(e) => {
              setPageSize(Number(e.target.value));
              setAfters([undefined]);
            }}
          >
            {PAGE_SIZES.map((n) => (
              <option key={n}>{n}</option>
            ))}
          </select>
        </label>
        <button onClick={() => setInsert(insert ? null : {})}>{insert ? "Cancel insert" : "Insert row"}</button>
        <button onClick={() => void exportAll("csv")} disabled={exporting?.startsWith("exporting")}>
          Export CSV
        </button>
        <button onClick={() => void exportAll("json")} disabled={exporting?.startsWith("exporting")}>
          Export JSON
        </button>
        {exporting && <span className="muted export-status">{exporting}</span>}
      </div>
      {error && <div className="error">{error}</div>}
      {rowError && <div className="error">{rowError}</div>}
      <div className="scroll">
        <table className="grid rows" data-rows-of={table.name}>
          <thead>
            <tr>
              {cols.map((c) => (
                <th key={c.name} title={c.type}>
                  {c.name}
                  <span className="type">{c.type}</span>
                </th>
              ))}
              <th className="muted">version</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {insert && (
              <tr className="insert">
                {cols.map((c) => (
                  <td key={c.name}>
                    <Editor
                      column={c}
                      value={insert[c.name] ?? ""}
                      placeholder={c.default !== null && c.default !== undefined ? `default ${show(c.default)}` : c.type}
                      onChange={(v) => setInsert({ ...insert, [c.name]: v })}
                      onCommit={() => void doInsert()}
                      onCancel={() => setInsert(null)}
                    />
                  </td>
                ))}
                <td />
                <td>
                  <button onClick={() => void doInsert()}>Save</button>
                </td>
              </tr>
            )}
            {page?.rows.map(({ row, version }) => {
              const id = row[pk];
              return (
                <tr key={JSON.stringify(id)}>
                  {cols.map((c) => {
                    const isEditing = editing && editing.id === id && editing.col === c.name;
                    const err = cellError && cellError.id === id && cellError.col === c.name ? cellError.message : null;
                    return (
                      <td
                        key={c.name}
                        className={c.primary_key ? "pk" : "editable"}
                        title={c.type.toLowerCase() === "timestamp" ? isoOfMicros(row[c.name]) : c.primary_key ? "primary key" : "double-click to edit"}
                        onDoubleClick={() => {
                          if (!c.primary_key && !isEditing) {
                            setEditing({ id, col: c.name, draft: draftOf(row[c.name], c.type) });
                            setCellError(null);
                          }
                        }}
                      >
                        {isEditing ? (
                          <Editor
                            column={c}
                            value={editing.draft}
                            autoFocus
                            onChange={(v) => setEditing({ ...editing, draft: v })}
                            onCommit={() => void save()}
                            onCancel={() => {
                              setEditing(null);
                              setCellError(null);
                            }}
                            onNull={() => void save(true)}
                          />
                        ) : (
                          <span className={row[c.name] === null ? "null" : undefined}>{show(row[c.name])}</span>
                        )}
                        {err && <div className="error inline">{err}</div>}
                      </td>
                    );
                  })}
                  <td className="muted">{version ?? "—"}</td>
                  <td>
                    <button className="link danger" title="delete this row" onClick={() => void remove(id)}>
                      Delete
                    </button>
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </div>
      <div className="pager">
        <button disabled={afters.length <= 1} onClick={() => setAfters(afters.slice(0, -1))}>
          ← Previous
        </button>
        <span className="muted">
          page {pageNo} · {page?.rows.length ?? 0} rows{page?.filter ? ` where ${page.filter}` : ""} · seq {page?.seq ?? "…"}
        </span>
        <button disabled={page?.next === null || page?.next === undefined} onClick={() => setAfters([...afters, page!.next])}>
          Next page →
        </button>
        <button className="link" onClick={() => void load()}>
          Reload
        </button>
      </div>
    </div>
  );
}

/** A type-aware editor: a checkbox-like select for booleans, a textarea for JSON, a number field for numbers. */
function Editor(props: {
  column: Column;
  value: string;
  placeholder?: string;
  autoFocus?: boolean;
  onChange: (v: string) => void;
  onCommit: () => void;
  onCancel: () => void;
  /** Offered while editing a cell: writes NULL (the server refuses it for NOT NULL columns). */
  onNull?: () => void;
}) {
  const { onNull } = props;
  const field = <Field {...props} />;
  if (!onNull) return field;
  return (
    <span className="editor">
      {field}
      <button type="button" className="link" title="set to NULL" onMouseDown={(e) => e.preventDefault()} onClick={onNull}>
        NULL
      </button>
    </span>
  );
}

function Field(props: {
  column: Column;
  value: string;
  placeholder?: string;
  autoFocus?: boolean;
  onChange: (v: string) => void;
  onCommit: () => void;
  onCancel: () => void;
}) {
  const { column: c, value, onChange, onCommit, onCancel } = props;
  const type = c.type.toLowerCase();
  const keys = (e: React.KeyboardEvent) => {
    if (e.key === "Escape") onCancel();
    else if (e.key === "Enter" && (type !== "json" || e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      onCommit();
    }
  };
  if (type === "boolean")
    return (
      <select value={value} autoFocus={props.autoFocus} onChange={(e) => onChange(e.target.value)} onKeyDown={keys} name={c.name}>
        <option value="">{c.not_null ? "—" : "NULL"}</option>
        <option value="true">true</option>
        <option value="false">false</option>
      </select>
    );
  if (type === "json")
    return (
      <textarea
        name={c.name}
        rows={2}
        value={value}
        placeholder={props.placeholder ?? "JSON (Ctrl+Enter saves)"}
        autoFocus={props.autoFocus}
        onChange={(e) => onChange(e.target.value)}
        onKeyDown={keys}
      />
    );
  const numeric = type === "integer" || type === "real";
  return (
    <input
      name={c.name}
      type="text"
      inputMode={numeric ? "decimal" : undefined}
      value={value}
      placeholder={props.placeholder ?? (type === "timestamp" ? "µs or ISO 8601" : c.type)}
      autoFocus={props.autoFocus}
      onChange={(e) => onChange(e.target.value)}
      onKeyDown={keys}
    />
  );
}
