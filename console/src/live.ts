// Live results and topic tails for the console, with the shapes of the SDK's `LiveQuery` and
// `TopicWatch` (sdk/ts/README.md) so the UI does not care which one feeds it. This one rides
// Server-Sent Events (`GET /v1/live`, `GET /v1/topics/{t}/watch`, docs/api.md) with
// `?access_token=`: the browser's EventSource reconnects by itself and sends `Last-Event-ID`,
// so a dropped stream resumes from the last seq/offset (exact diffs or a `reset` snapshot)
// while the rows stay on screen with status "reconnecting".

import { Api, ApiError, Row } from "./api";

export type LiveStatus = "loading" | "live" | "reconnecting" | "error";

/** What the UI needs of a live result: the SDK's `LiveQuery`, plus keys and types when known. */
export interface LiveView {
  readonly rows: readonly Row[];
  readonly keys?: readonly unknown[];
  readonly columns: string[];
  readonly types?: (string | null)[];
  readonly status: LiveStatus;
  readonly error: { code: string; message: string; details?: Record<string, unknown> } | null;
  readonly seq: number;
  subscribe(listener: () => void): () => void;
  close(): void;
}

type Change = { op: "add" | "remove" | "change"; key: unknown; row?: Row; index?: number };

const keyOf = (k: unknown) => JSON.stringify(k);

/** Applies snapshot + diffs (docs/protocol.md, "Applying a diff") to an array of rows. */
export class LiveRows {
  rows: Row[] = [];
  keys: unknown[] = [];

  snapshot(keys: unknown[], rows: Row[]) {
    this.keys = keys.slice();
    this.rows = rows.slice();
  }

  apply(changes: Change[]) {
    const rows = this.rows.slice();
    const keys = this.keys.slice();
    const find = (key: unknown, hint?: number) => {
      const k = keyOf(key);
      if (hint !== undefined && hint < keys.length && keyOf(keys[hint]) === k) return hint;
      return keys.findIndex((x) => keyOf(x) === k);
    };
    for (const c of changes) {
      if (c.op === "remove") {
        const at = find(c.key, c.index);
        if (at >= 0) {
          rows.splice(at, 1);
          keys.splice(at, 1);
        }
      } else if (c.op === "add") {
        const at = c.index ?? rows.length;
        rows.splice(at, 0, c.row as Row);
        keys.splice(at, 0, c.key);
      } else {
        const old = find(c.key);
        if (c.index === undefined && old >= 0) {
          rows[old] = c.row as Row; // unordered view: replace in place
          continue;
        }
        if (old >= 0) {
          rows.splice(old, 1);
          keys.splice(old, 1);
        }
        const at = c.index ?? rows.length;
        rows.splice(at, 0, c.row as Row);
        keys.splice(at, 0, c.key);
      }
    }
    this.rows = rows;
    this.keys = keys;
  }
}

class Emitter {
  private listeners = new Set<() => void>();
  subscribe(l: () => void) {
    this.listeners.add(l);
    return () => void this.listeners.delete(l);
  }
  emit() {
    for (const l of [...this.listeners]) l();
  }
}

/** Reads the JSON error of a stream that the server refused before it started. */
async function refusal(api: Api, url: string): Promise<ApiError> {
  const ctl = new AbortController();
  try {
    const res = await fetch(url, { headers: { Authorization: `Bearer ${api.token}` }, signal: ctl.signal });
    if (res.ok) {
      ctl.abort();
      return new ApiError("disconnected", "the stream closed");
    }
    const body = (await res.json()) as { error?: { code: string; message: string } };
    const { code, message, ...rest } = body.error ?? { code: `http_${res.status}`, message: res.statusText };
    return new ApiError(code, message, res.status, rest);
  } catch (e) {
    return new ApiError("disconnected", `cannot reach the server: ${String(e)}`);
  }
}

function streamUrl(api: Api, path: string, q: URLSearchParams): string {
  q.set("access_token", api.token);
  return `${api.url(path)}?${q}`;
}

export function openLive(api: Api, sql: string): LiveView {
  const em = new Emitter();
  const data = new LiveRows();
  const url = streamUrl(api, "/v1/live", new URLSearchParams({ sql }));
  const es = new EventSource(url);
  const view = {
    get rows() {
      return data.rows;
    },
    get keys() {
      return data.keys;
    },
    columns: [] as string[],
    types: [] as (string | null)[],
    status: "loading" as LiveStatus,
    error: null as ApiError | null,
    seq: 0,
    subscribe: (l: () => void) => em.subscribe(l),
    close: () => es.close(),
  };
  es.addEventListener("snapshot", (ev) => {
    const m = JSON.parse((ev as MessageEvent).data);
    data.snapshot(m.keys ?? [], m.rows ?? []);
    view.columns = m.columns ?? [];
    view.types = m.types ?? [];
    view.seq = m.seq;
    view.status = "live";
    em.emit();
  });
  es.addEventListener("diff", (ev) => {
    const m = JSON.parse((ev as MessageEvent).data);
    data.apply(m.changes ?? []);
    view.seq = m.seq;
    view.status = "live";
    em.emit();
  });
  es.addEventListener("error", (ev) => {
    const me = ev as MessageEvent;
    if (typeof me.data === "string" && me.data) {
      // `event: error` from the server: the subscription ended.
      const e = JSON.parse(me.data).error ?? {};
      const { code, message, ...rest } = e;
      view.error = new ApiError(code ?? "error", message ?? "", undefined, rest);
      view.status = "error";
      es.close();
      em.emit();
      return;
    }
    if (es.readyState === EventSource.CLOSED) {
      void refusal(api, url).then((err) => {
        view.error = err;
        view.status = "error";
        em.emit();
      });
    } else {
      view.status = view.seq ? "reconnecting" : "loading";
      em.emit();
    }
  });
  return view;
}

export interface TopicRecord {
  topic: string;
  offset: number;
  ts: number;
  tags: string[];
  data: unknown;
}

/** The SDK's `TopicWatch`: records oldest first, at most `keep` of the newest. */
export interface TopicTail {
  readonly records: readonly TopicRecord[];
  readonly next: number;
  readonly status: LiveStatus;
  readonly error: { code: string; message: string; details?: Record<string, unknown> } | null;
  subscribe(listener: () => void): () => void;
  close(): void;
}

/** A live tail of a topic, keeping the `keep` newest records (oldest first). */
export function openWatch(api: Api, topic: string, tags: string[], from: number | null, keep = 500): TopicTail {
  const em = new Emitter();
  const q = new URLSearchParams();
  for (const t of tags) q.append("tag", t);
  if (from !== null) q.set("from", String(from));
  const url = streamUrl(api, `/v1/topics/${encodeURIComponent(topic)}/watch`, q);
  const es = new EventSource(url);
  const tail = {
    records: [] as TopicRecord[],
    next: from ?? 0,
    status: "loading" as LiveStatus,
    error: null as ApiError | null,
    subscribe: (l: () => void) => em.subscribe(l),
    close: () => es.close(),
  };
  es.addEventListener("watching", (ev) => {
    tail.next = JSON.parse((ev as MessageEvent).data).next;
    tail.status = "live";
    em.emit();
  });
  es.addEventListener("record", (ev) => {
    const r = JSON.parse((ev as MessageEvent).data);
    tail.records = [...tail.records, { topic, ...r }].slice(-keep);
    tail.next = r.offset + 1;
    tail.status = "live";
    em.emit();
  });
  es.addEventListener("error", (ev) => {
    const me = ev as MessageEvent;
    if (typeof me.data === "string" && me.data) {
      const { code, message, ...rest } = JSON.parse(me.data).error ?? {};
      tail.error = new ApiError(code ?? "error", message ?? "", undefined, rest);
      tail.status = "error";
      es.close();
      em.emit();
      return;
    }
    if (es.readyState === EventSource.CLOSED) {
      void refusal(api, url).then((err) => {
        tail.error = err;
        tail.status = "error";
        em.emit();
      });
    } else {
      tail.status = "reconnecting";
      em.emit();
    }
  });
  return tail;
}
