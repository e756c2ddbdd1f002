// The console's HTTP side: every call sends the admin token as `Authorization: Bearer`
// (docs/api.md). Errors become `ApiError` carrying the server's code, message and the rest of
// its error object (`reason`, `statement`, `op`, …), so the UI can show them verbatim.

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type Row = Record<string, unknown>;

export class ApiError extends Error {
  code: string;
  status?: number;
  details: Record<string, unknown>;
  constructor(code: string, message: string, status?: number, details: Record<string, unknown> = {}) {
    super(message);
    this.code = code;
    this.status = status;
    this.details = details;
  }
  /** One line for the UI: `code: message (reason …, statement …)`. */
  describe(): string {
    const extra = Object.entries(this.details)
      .filter(([k]) => k !== "code" && k !== "message")
      .map(([k, v]) => `${k} ${typeof v === "string" ? v : JSON.stringify(v)}`);
    return `${this.code}: ${this.message}${extra.length ? ` (${extra.join(", ")})` : ""}`;
  }
}

/** An error as one line: `code: message (details…)` for the server's (and the SDK's) errors. */
export function describeError(e: unknown): string {
  if (e instanceof ApiError) return e.describe();
  if (e && typeof e === "object" && typeof (e as { code?: unknown }).code === "string") {
    const { code, message, details } = e as { code: string; message?: string; details?: Record<string, unknown> };
    return new ApiError(code, message ?? "", undefined, details ?? {}).describe();
  }
  if (e instanceof Error) return e.message;
  return String(e);
}

export interface Column {
  name: string;
  type: string;
  not_null: boolean;
  primary_key: boolean;
  default: unknown;
}
export interface Table {
  name: string;
  columns: Column[];
  primary_key: string;
  indexes: unknown[];
}
export interface Policy {
  name: string;
  table: string;
  command: string;
  using: string | null;
  check: string | null;
}
export interface TopicInfo {
  name: string;
  first: number;
  last: number | null;
  next: number;
  records: number;
  bytes: number;
}
export interface QueryResult {
  seq: number;
  columns: string[];
  types: (string | null)[];
  rows: Row[];
}
export type SqlEntry =
  | { statement: number; kind: "ddl"; changed: boolean }
  | { statement: number; kind: "select"; columns: string[]; types: (string | null)[]; rows: Row[] }
  | { statement: number; kind: "insert" | "update" | "delete"; count: number; results: unknown[] };
export interface SqlReply {
  seq: number;
  changed: boolean;
  /** One entry per statement (absent from servers that predate SQL writes). */
  results?: SqlEntry[];
}
export type Op =
  | { op: "insert" | "upsert"; table: string; row: Row }
  | { op: "patch"; table: string; id: unknown; set: Row }
  | { op: "delete"; table: string; id: unknown };

/** The server the console talks to: `location.origin`, or `?server=` when given. */
export function serverBase(): string {
  const given = new URLSearchParams(location.search).get("server");
  return (given || location.origin).replace(/\/+$/, "");
}

export class Api {
  constructor(
    readonly base: string,
    readonly token: string,
  ) {}

  url(path: string): string {
    return this.base + path;
  }

  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    let res: Response;
    try {
      res = await fetch(this.url(path), {
        method,
        headers: {
          Authorization: `Bearer ${this.token}`,
          ...(body === undefined ? {} : { "Content-Type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError("disconnected", `cannot reach ${this.base}: ${describeError(e)}`);
    }
    const text = await res.text();
    if (!res.ok) {
      let err: Record<string, unknown> | undefined;
      try {
        err = (JSON.parse(text) as { error?: Record<string, unknown> }).error;
      } catch {
        /* not JSON: use the text */
      }
      if (err && typeof err.code === "string") {
        const { code, message, ...rest } = err;
        throw new ApiError(code, String(message ?? ""), res.status, rest);
      }
      throw new ApiError(`http_${res.status}`, text.slice(0, 300) || res.statusText, res.status);
    }
    if (path === "/metrics") return text as unknown as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ApiError("protocol", `${path} answered something that is not JSON`, res.status);
    }
  }

  tables() {
    return this.request<{ tables: Table[]; seq: number }>("GET", "/v1/tables");
  }
  rows(table: string, after: unknown, limit: number) {
    const q = new URLSearchParams({ limit: String(limit) });
    if (after !== undefined && after !== null) q.set("after", String(after));
    return this.request<{ rows: { row: Row; version: number }[]; next: unknown; seq: number }>(
      "GET",
      `/v1/tables/${encodeURIComponent(table)}/rows?${q}`,
    );
  }
  query(sql: string, params?: unknown[] | Record<string, unknown>, as?: Record<string, unknown>) {
    return this.request<QueryResult>("POST", "/v1/query", {
      sql,
      ...(params ? { params } : {}),
      ...(as ? { as } : {}),
    });
  }
  sql(sql: string) {
    return this.request<SqlReply>("POST", "/v1/sql", { sql });
  }
  mutate(ops: Op[]) {
    return this.request<{ seq: number; results: unknown[] }>("POST", "/v1/mutate", { ops });
  }
  policies() {
    return this.request<{ policies: Policy[]; seq: number }>("GET", "/v1/policies");
  }
  topics() {
    return this.request<{ topics: TopicInfo[]; seq: number }>("GET", "/v1/topics");
  }
  metrics() {
    return this.request<string>("GET", "/metrics");
  }
}

/** Double-quote an identifier for SQL text. */
export function ident(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}
