import { useEffect, useState } from "react";
import { Api, Policy, QueryResult, describeError, ident } from "./api";
import { RowsTable } from "./Sql";

export function PoliciesView({ api }: { api: Api }) {
  const [policies, setPolicies] = useState<Policy[] | null>(null);
  const [tables, setTables] = useState<string[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [sel, setSel] = useState<string | null>(null);
  useEffect(() => {
    Promise.all([api.policies(), api.tables()])
      .then(([p, t]) => {
        setPolicies(p.policies);
        const names = t.tables.map((x) => x.name);
        setTables(names);
        setSel((s) => s ?? names[0] ?? null);
      })
      .catch((e) => setError(describeError(e)));
  }, [api]);
  return (
    <div className="split">
      <aside>
        <div className="aside-head">
          <b>Policies by table</b>
        </div>
        {error && <div className="error">{error}</div>}
        <ul className="list">
          {tables.map((t) => {
            const n = policies?.filter((p) => p.table === t).length ?? 0;
            return (
              <li key={t}>
                <button className={t === sel ? "item active" : "item"} onClick={() => setSel(t)} data-table={t}>
                  {t} <span className="muted">{n === 0 ? "no policy" : `${n} polic${n === 1 ? "y" : "ies"}`}</span>
                </button>
              </li>
            );
          })}
        </ul>
      </aside>
      <section className="grow">
        {sel && policies && <TablePolicies key={sel} api={api} table={sel} policies={policies.filter((p) => p.table === sel)} />}
      </section>
    </div>
  );
}

function TablePolicies({ api, table, policies }: { api: Api; table: string; policies: Policy[] }) {
  const [claims, setClaims] = useState(() => sessionStorage.getItem("sluice.console.claims") ?? '{"sub": "alice"}');
  const [sql, setSql] = useState(`SELECT * FROM ${ident(table)} LIMIT 100`);
  const [asClient, setAsClient] = useState<QueryResult | null>(null);
  const [asAdmin, setAsAdmin] = useState<number | null>(null);
  const [error, setError] = useState<string | null>(null);
  const preview = async () => {
    setError(null);
    setAsClient(null);
    let parsed: Record<string, unknown>;
    try {
      parsed = JSON.parse(claims);
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("claims must be a JSON object");
    } catch (e) {
      setError(`claims: ${(e as Error).message}`);
      return;
    }
    sessionStorage.setItem("sluice.console.claims", claims);
    try {
      const [c, a] = await Promise.all([api.query(sql, undefined, parsed), api.query(sql)]);
      setAsClient(c);
      setAsAdmin(a.rows.length);
    } catch (e) {
      setError(describeError(e));
    }
  };
  return (
    <div>
      <h3>Policies on {table}</h3>
      {policies.length === 0 ? (
        <p className="muted">
          No policy: clients can neither read nor write this table (<code>CREATE POLICY … ON {table}</code> in the SQL tab).
        </p>
      ) : (
        <table className="grid small">
          <thead>
            <tr>
              <th>name</th>
              <th>command</th>
              <th>using</th>
              <th>with check</th>
            </tr>
          </thead>
          <tbody>
            {policies.map((p) => (
              <tr key={p.name}>
                <td>{p.name}</td>
                <td>{p.command}</td>
                <td>
                  <code>{p.using ?? ""}</code>
                </td>
                <td>
                  <code>{p.check ?? ""}</code>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <h3>Run as these claims</h3>
      <div className="runas">
        <label>
          claims (JSON)
          <textarea name="claims" rows={3} spellCheck={false} value={claims} onChange={(e) => setClaims(e.target.value)} />
        </label>
        <label>
          query
          <textarea name="preview-sql" rows={3} spellCheck={false} value={sql} onChange={(e) => setSql(e.target.value)} />
        </label>
      </div>
      <button className="primary" onClick={() => void preview()} data-action="preview">
        Preview
      </button>
      {error && <div className="error">{error}</div>}
      {asClient && (
        <div className="results">
          <div className="status" data-preview-count={asClient.rows.length}>
            a client with these claims sees <b>{asClient.rows.length}</b> row{asClient.rows.length === 1 ? "" : "s"}
            {asAdmin !== null && <span className="muted"> (the admin sees {asAdmin})</span>}
          </div>
          <RowsTable columns={asClient.columns} types={asClient.types} rows={asClient.rows} />
        </div>
      )}
    </div>
  );
}
