import { useEffect, useMemo, useState } from "react";
import { connect } from "sluice-client";
import { Api, ApiError, describeError, serverBase } from "./api";
import { TablesView } from "./Tables";
import { SqlView } from "./Sql";
import { PoliciesView } from "./Policies";
import { TopicsView } from "./Topics";
import { MetricsView } from "./Metrics";

const KEY = "sluice.console.token";
const TABS = ["Tables", "SQL", "Policies", "Topics", "Metrics"] as const;
type Tab = (typeof TABS)[number];

function storedToken(): string | null {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY);
}

export function App() {
  const base = serverBase();
  const [api, setApi] = useState<Api | null>(null);
  const [checking, setChecking] = useState(() => storedToken() !== null);
  const [startError, setStartError] = useState<string | null>(null);
  const [tab, setTab] = useState<Tab>(() => {
    const h = decodeURIComponent(location.hash.slice(1));
    return (TABS as readonly string[]).includes(h) ? (h as Tab) : "Tables";
  });

  useEffect(() => {
    const t = storedToken();
    if (t === null) return;
    const a = new Api(base, t);
    a.policies()
      .then(() => setApi(a))
      .catch((e) => {
        // Forget a token the server refuses; keep it when the server is only unreachable.
        if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
          sessionStorage.removeItem(KEY);
          localStorage.removeItem(KEY);
        }
        setStartError(`The stored token was not accepted: ${describeError(e)}`);
      })
      .finally(() => setChecking(false));
  }, [base]);

  // One SDK client (one WebSocket) per signed-in token, for live results and topic tails.
  const client = useMemo(() => (api ? connect({ url: api.base, token: api.token }) : null), [api]);
  useEffect(() => () => client?.close(), [client]);

  const choose = (t: Tab) => {
    setTab(t);
    history.replaceState(null, "", `${location.pathname}${location.search}#${t}`);
  };

  if (checking) return <div className="center muted">Checking the stored token…</div>;
  if (!api || !client)
    return (
      <SignIn
        base={base}
        initialError={startError}
        onSignedIn={(a, remember) => {
          (remember ? localStorage : sessionStorage).setItem(KEY, a.token);
          setApi(a);
        }}
      />
    );
  return (
    <div className="app">
      <header>
        <span className="brand">Sluice</span>
        <nav>
          {TABS.map((t) => (
            <button key={t} className={t === tab ? "tab active" : "tab"} onClick={() => choose(t)} data-tab={t}>
              {t}
            </button>
          ))}
        </nav>
        <span className="server muted" title="server">
          {base}
        </span>
        <button
          className="link"
          onClick={() => {
            sessionStorage.removeItem(KEY);
            localStorage.removeItem(KEY);
            setApi(null);
          }}
        >
          Sign out
        </button>
      </header>
      <main>
        {tab === "Tables" && <TablesView api={api} />}
        {tab === "SQL" && <SqlView api={api} client={client} />}
        {tab === "Policies" && <PoliciesView api={api} />}
        {tab === "Topics" && <TopicsView api={api} client={client} />}
        {tab === "Metrics" && <MetricsView api={api} />}
      </main>
    </div>
  );
}

function SignIn(props: { base: string; initialError: string | null; onSignedIn: (api: Api, remember: boolean) => void }) {
  const { base, onSignedIn } = props;
  const [token, setToken] = useState("");
  const [remember, setRemember] = useState(false);
  const [error, setError] = useState<string | null>(props.initialError);
  const [busy, setBusy] = useState(false);
  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    const a = new Api(base, token.trim());
    try {
      // GET /v1/policies is admin-only: a client JWT is refused with 403, so only the admin
      // token signs in.
      await a.policies();
      onSignedIn(a, remember);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        const reason = err.details.reason ? ` (reason: ${String(err.details.reason)})` : "";
        setError(`Refused: ${err.message}${reason}`);
      } else if (err instanceof ApiError && err.status === 403) {
        setError(`Refused: this token is not the admin token (${err.message})`);
      } else setError(describeError(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form className="signin" onSubmit={submit}>
      <h1>Sluice console</h1>
      <p className="muted">Sign in with the server's admin token ({base}).</p>
      <input
        type="password"
        name="token"
        placeholder="admin token"
        autoFocus
        value={token}
        onChange={(e) => setToken(e.target.value)}
      />
      <label>
        <input type="checkbox" checked={remember} onChange={(e) => setRemember(e.target.checked)} /> remember on this
        browser
      </label>
      <button type="submit" disabled={busy || !token.trim()}>
        {busy ? "Signing in…" : "Sign in"}
      </button>
      {error && (
        <div className="error" role="alert">
          {error}
        </div>
      )}
    </form>
  );
}
