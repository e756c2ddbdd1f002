import type { SluiceError } from "./errors.js";

export type Encoding = "msgpack" | "json";
export type Durability = "memory" | "disk" | "fsync" | "replicated";
/** A token, or a function called at every (re)connect and HTTP request to get a fresh one. */
export type TokenSource = string | (() => string | Promise<string>);
export type Params = unknown[] | Record<string, unknown>;

export interface ConnectOptions {
  /** http(s)://host:port — the SDK derives ws(s)://…/v1/ws. */
  url: string;
  /** Admin token or client JWT; sent as ?access_token= on the socket, Bearer over HTTP. */
  token?: TokenSource;
  /** Default "msgpack" (sluice.msgpack.v1). */
  encoding?: Encoding;
  /** Jittered exponential backoff; defaults 100 / 5000 ms. */
  reconnect?: { initialDelayMs?: number; maxDelayMs?: number };
  /** Node 20 has no global WebSocket: pass one (e.g. from "ws"); browsers use the global. */
  WebSocket?: unknown;
  fetch?: typeof fetch;
  /** How long a request sent while disconnected waits for the connection (default 10 000 ms). */
  requestTimeoutMs?: number;
  /** Ping interval to notice a dead connection (no pong within as long again → reconnect); default 20 000, 0 = off. */
  heartbeatMs?: number;
  /**
   * @internal Test hooks. `beforeApply` sees every live event (decoded wire form) before it is
   * applied; `assumeTypes` supplies column types for snapshots that carry none (servers before
   * column types), so the checksum can be verified against them.
   */
  testHooks?: {
    beforeApply?: (event: unknown) => void;
    assumeTypes?: (sql: string, columns: string[]) => (string | null)[] | undefined;
    /** Awaited before every connection attempt (a test holds the client offline with it). */
    beforeConnect?: () => Promise<void> | void;
  };
}

export type ClientStatus = "connecting" | "open" | "reconnecting" | "closed";
export type LiveStatus = "loading" | "live" | "reconnecting" | "error";

export type Op =
  | { op: "insert"; table: string; row: Record<string, unknown>; if_version?: number }
  | { op: "upsert"; table: string; row: Record<string, unknown>; if_version?: number }
  | { op: "patch"; table: string; id: unknown; set: Record<string, unknown>; if_version?: number }
  | { op: "delete"; table: string; id: unknown; if_version?: number };

export interface QueryResult<Row> {
  seq: number;
  columns: string[];
  types: (string | null)[];
  rows: Row[];
}

export interface WriteResult {
  table: string;
  id: unknown;
  version: number;
}

export interface MutateResult {
  seq: number;
  results: WriteResult[];
}

export type SqlStatementResult =
  | { statement: number; kind: "select"; columns: string[]; types: (string | null)[]; rows: Record<string, unknown>[] }
  | { statement: number; kind: "insert" | "update" | "delete"; count: number; results: WriteResult[] }
  | { statement: number; kind: "ddl"; changed: boolean };

/** The reply of POST /v1/sql (docs/api.md, "SQL"). */
export interface SqlReply {
  seq: number;
  changed: boolean;
  results: SqlStatementResult[];
}

export interface TopicRecord<Data> {
  topic: string;
  offset: number;
  ts: number;
  tags: string[];
  data: Data;
}

export interface LiveQuery<Row> {
  /** In the view's order; kept (not cleared) while reconnecting. A new array after every change. */
  readonly rows: readonly Row[];
  readonly status: LiveStatus;
  /** Set when status is "error" (the subscription ended). */
  readonly error: SluiceError | null;
  /** Seq of the last applied event (0 before the snapshot). */
  readonly seq: number;
  readonly columns: string[];
  /** Called after every change of rows/status/error; returns unsubscribe. */
  subscribe(listener: () => void): () => void;
  close(): void;
}

export interface TopicWatch<Data> {
  /** Kept up to `keep` (default 1000) newest. */
  readonly records: readonly TopicRecord<Data>[];
  /** The offset to resume from. */
  readonly next: number;
  readonly status: LiveStatus;
  readonly error: SluiceError | null;
  subscribe(listener: (record?: TopicRecord<Data>) => void): () => void;
  close(): void;
}

export interface Client {
  readonly status: ClientStatus;
  onStatus(listener: (status: ClientStatus) => void): () => void;
  setToken(token: TokenSource): void;

  query<Row = Record<string, unknown>>(sql: string, params?: Params): Promise<QueryResult<Row>>;
  mutate(ops: Op[], options?: { durability?: Durability }): Promise<MutateResult>;
  call<Result = unknown>(name: string, args?: unknown, options?: { durability?: Durability }): Promise<{ seq: number; result: Result }>;
  sql(sql: string, params?: Params, options?: { durability?: Durability }): Promise<SqlReply>;
  /** Any other HTTP endpoint (docs/api.md) with the client's token; a JSON body; errors as SluiceError. */
  http<T = unknown>(method: string, path: string, body?: unknown): Promise<T>;

  live<Row = Record<string, unknown>>(sql: string, params?: Params): LiveQuery<Row>;

  append(
    topic: string,
    records: { tags?: string[]; data?: unknown }[],
    options?: { durability?: Durability },
  ): Promise<{ seq: number; first: number; last: number }>;
  watch<Data = unknown>(topic: string, options?: { from?: number; tags?: string[]; keep?: number }): TopicWatch<Data>;

  close(): void;
}
