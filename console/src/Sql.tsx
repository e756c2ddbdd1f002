import { useEffect, useRef, useState } from "react";
import { Api, ApiError, Row, SqlReply, describeError } from "./api";
import type { Client } from "sluice-client";
import { LiveView } from "./live";
import { isoOfMicros, show } from "./values";

/** A lone SELECT (one statement, with a FROM) is shown live; anything else goes to /v1/sql. */
export function isLoneSelect(sql: string): boolean {
  const text = sql.trim().replace(/;\s*$/, "");
  if (!/^select\b/i.test(text)) return false;
  if (stripStrings(text).includes(";")) return false;
  return /\bfrom\b/i.test(stripStrings(text));
}
function stripStrings(s: string): string {
  return s.replace(/'(?:[^']|'')*'/g, "''").replace(/"(?:[^"]|"")*"/g, '""');
}

const FLASH_MS = 1500;

export function SqlView({ api, client }: { api: Api; client: Client }) {
  const [text, setText] = useState(() => sessionStorage.getItem("sluice.console.sql") ?? "SELECT * FROM ");
  const [reply, setReply] = useState<SqlReply | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [live, setLive] = useState<LiveView | null>(null);

  useEffect(() => () => live?.close(), [live]);

  const run = async () => {
    sessionStorage.setItem("sluice.console.sql", text);
    live?.close();
    setLive(null);
    setReply(null);
    setError(null);
    const sql = text.trim().replace(/;\s*$/, "");
    if (!sql) return;
    if (isLoneSelect(sql)) {
      setLive(client.live(sql));
      return;
    }
    setBusy(true);
    try {
      setReply(await api.sql(text));
    } catch (e) {
      // The server counts statements from 0; the page counts them from 1, as in the results.
      if (e instanceof ApiError && typeof e.details.statement === "number") {
        const { statement, ...rest } = e.details;
        const n = statement as number;
        setError(`statement ${n + 1} failed, nothing was applied — ${new ApiError(e.code, e.message, e.status, rest).describe()}`);
      } else setError(describeError(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <div>
      <div className="sqlbox">
        <textarea
          name="sql"
          spellCheck={false}
          rows={6}
          value={text}
          onChange={(e) => setText(e.target.value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
              e.preventDefault();
              void run();
            }
          }}
        />
        <div className="toolbar">
          <button className="primary" onClick={() => void run()} disabled={busy} data-action="run">
            Run
          </button>
          <span className="muted">Ctrl+Enter · a lone SELECT stays live; other statements run as one transaction</span>
          {live && (
            <button
              onClick={() => {
                live.close();
                setLive(null);
              }}
            >
              Stop live
            </button>
          )}
        </div>
      </div>
      {busy && <div className="status muted">running…</div>}
      {error && (
        <div className="error" role="alert">
          {error}
        </div>
      )}
      {reply && <SqlReplyView reply={reply} />}
      {live && <LiveResult view={live} />}
    </div>
  );
}

function SqlReplyView({ reply }: { reply: SqlReply }) {
  return (
    <div className="results">
      <div className="status muted">
        done · seq {reply.seq}
        {reply.changed ? " · schema changed" : ""}
      </div>
      {(reply.results ?? []).map((r) => (
        <div key={r.statement} className="result">
          <div className="muted">
            statement {r.statement + 1}: {r.kind}
            {r.kind === "ddl" && (r.changed ? " · changed" : " · nothing to change")}
            {(r.kind === "insert" || r.kind === "update" || r.kind === "delete") && ` · ${r.count} row${r.count === 1 ? "" : "s"}`}
            {r.kind === "select" && ` · ${r.rows.length} row${r.rows.length === 1 ? "" : "s"}`}
          </div>
          {r.kind === "select" && <RowsTable columns={r.columns} types={r.types} rows={r.rows} />}
        </div>
      ))}
    </div>
  );
}

export function RowsTable(props: {
  columns: string[];
  types?: (string | null)[];
  rows: readonly Row[];
  keys?: readonly unknown[];
  flash?: Set<string>;
}) {
  const { columns, types, rows, keys, flash } = props;
  return (
    <div className="scroll">
      <table className="grid rows">
        <thead>
          <tr>
            {columns.map((c, i) => (
              <th key={c}>
                {c}
                {types?.[i] && <span className="type">{types[i]}</span>}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.map((r, i) => {
            const k = keys ? JSON.stringify(keys[i]) : String(i);
            return (
              <tr key={k} className={flash?.has(JSON.stringify(r)) ? "flash" : undefined}>
                {columns.map((c, j) => (
                  <td key={c} title={types?.[j]?.toLowerCase() === "timestamp" ? isoOfMicros(r[c]) : undefined}>
                    <span className={r[c] === null ? "null" : undefined}>{show(r[c])}</span>
                  </td>
                ))}
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

/** A live result: re-renders on every snapshot/diff and flashes the rows that are new or changed. */
export function LiveResult({ view }: { view: LiveView }) {
  const [, setTick] = useState(0);
  const [flash, setFlash] = useState<Set<string>>(new Set());
  const seen = useRef<Set<string> | null>(null);
  useEffect(() => {
    const timers: number[] = [];
    const update = () => {
      // Compare live states only: the first snapshot (and rows kept while reconnecting) flash nothing.
      const now = view.status === "live" ? new Set(view.rows.map((r) => JSON.stringify(r))) : null;
      const prev = seen.current;
      if (now) seen.current = now;
      if (prev && now) {
        const changed = [...now].filter((r) => !prev.has(r));
        if (changed.length) {
          setFlash((f) => new Set([...f, ...changed]));
          timers.push(
            window.setTimeout(() => {
              setFlash((f) => {
                const g = new Set(f);
                for (const k of changed) g.delete(k);
                return g;
              });
            }, FLASH_MS),
          );
        }
      }
      setTick((t) => t + 1);
    };
    const off = view.subscribe(update);
    update();
    return () => {
      off();
      timers.forEach((t) => clearTimeout(t));
    };
  }, [view]);
  return (
    <div className="results">
      <div className={`status live-status ${view.status}`} data-status={view.status}>
        <span className="dot" /> {view.status}
        {view.status !== "loading" && ` · seq ${view.seq} · ${view.rows.length} row${view.rows.length === 1 ? "" : "s"}`}
        {view.error && ` · ${describeError(view.error)}`}
      </div>
      {view.columns.length > 0 && (
        <RowsTable columns={view.columns} rows={view.rows} flash={flash} />
      )}
    </div>
  );
}
