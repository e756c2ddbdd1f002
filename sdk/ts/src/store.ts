// Framework-free stores behind the React hooks (and usable with any `useSyncExternalStore`-like
// API): a stable snapshot object per change, `subscribe`, and `setQuery` that keeps showing the
// previous rows (status "loading") until the new query's first snapshot arrives.

import type { SluiceError } from "./errors.js";
import type { Client, LiveQuery, LiveStatus, Params, TopicRecord, TopicWatch } from "./types.js";

export interface LiveQueryState<Row> {
  rows: readonly Row[];
  status: LiveStatus;
  error: SluiceError | null;
}

const EMPTY: readonly never[] = Object.freeze([]);

export class LiveQueryStore<Row = Record<string, unknown>> {
  private current: LiveQuery<Row> | null = null;
  /** The query whose rows are shown while `current` loads. */
  private previous: LiveQuery<Row> | null = null;
  private unsubCurrent: (() => void) | null = null;
  private key: string | null = null;
  private state: LiveQueryState<Row> = { rows: EMPTY, status: "loading", error: null };
  private readonly listeners = new Set<() => void>();

  constructor(private client: Client) {}

  /** Switches to another client (closes the current query; the next setQuery opens one). */
  setClient(client: Client) {
    if (client === this.client) return;
    this.client = client;
    const key = this.key;
    this.close();
    if (key) {
      const [sql, params] = JSON.parse(key) as [string, Params | undefined];
      this.setQuery(sql, params);
    }
  }

  /** Follows `sql`/`params`; a call with the same ones as the current query does nothing. */
  setQuery(sql: string, params?: Params): void {
    const key = JSON.stringify([sql, params ?? null]);
    if (key === this.key) return;
    this.key = key;
    this.unsubCurrent?.();
    if (this.current) {
      // Keep the old rows on screen until the new snapshot: hold the old query if it had any.
      if (this.current.status === "live" || this.current.status === "reconnecting" || this.current.rows.length > 0) {
        this.previous?.close();
        this.previous = this.current;
      } else this.current.close();
    }
    const q = this.client.live<Row>(sql, params);
    this.current = q;
    this.unsubCurrent = q.subscribe(() => this.update());
    this.update();
  }

  private update() {
    const q = this.current;
    let next: LiveQueryState<Row>;
    if (!q) next = { rows: EMPTY, status: "loading", error: null };
    else if (q.status === "loading" && this.previous) next = { rows: this.previous.rows, status: "loading", error: null };
    else {
      if (this.previous && q.status !== "loading") {
        this.previous.close();
        this.previous = null;
      }
      next = { rows: q.rows, status: q.status, error: q.error };
    }
    const s = this.state;
    if (s.rows === next.rows && s.status === next.status && s.error === next.error) return;
    this.state = next;
    for (const l of [...this.listeners]) l();
  }

  getSnapshot = (): LiveQueryState<Row> => this.state;

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  /** Closes the queries; a later setQuery opens a new one. */
  close(): void {
    this.unsubCurrent?.();
    this.unsubCurrent = null;
    this.current?.close();
    this.previous?.close();
    this.current = this.previous = null;
    this.key = null;
  }
}

export interface TopicState<Data> {
  records: readonly TopicRecord<Data>[];
  status: LiveStatus;
  error: SluiceError | null;
}

export class TopicStore<Data = unknown> {
  private watch: TopicWatch<Data> | null = null;
  private unsub: (() => void) | null = null;
  private key: string | null = null;
  private state: TopicState<Data> = { records: EMPTY, status: "loading", error: null };
  private readonly listeners = new Set<() => void>();

  constructor(private client: Client) {}

  setClient(client: Client) {
    if (client === this.client) return;
    this.client = client;
    const key = this.key;
    this.close();
    if (key) {
      const [topic, opts] = JSON.parse(key) as [string, { from?: number; tags?: string[]; keep?: number }];
      this.setTopic(topic, opts);
    }
  }

  setTopic(topic: string, options: { from?: number; tags?: string[]; keep?: number } = {}): void {
    const key = JSON.stringify([topic, options]);
    if (key === this.key) return;
    this.close();
    this.key = key;
    const w = this.client.watch<Data>(topic, options);
    this.watch = w;
    this.unsub = w.subscribe(() => this.update());
    this.update();
  }

  private update() {
    const w = this.watch;
    const next: TopicState<Data> = w ? { records: w.records, status: w.status, error: w.error } : { records: EMPTY, status: "loading", error: null };
    const s = this.state;
    if (s.records === next.records && s.status === next.status && s.error === next.error) return;
    this.state = next;
    for (const l of [...this.listeners]) l();
  }

  getSnapshot = (): TopicState<Data> => this.state;

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  close(): void {
    this.unsub?.();
    this.unsub = null;
    this.watch?.close();
    this.watch = null;
    this.key = null;
  }
}
