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

/** A row read by primary key (`Client.get`): `row` is null when there is no such row or the caller may not read it. */
export interface GetResult<Row> {
  seq: number;
  row: Row | null;
  version: number | null;
}

/** Rows read by primary key in one request (`Client.getMany`): one entry per key asked, in that order; null when there is no such row or the caller may not read it. */
export interface GetManyResult<Row> {
  seq: number;
  rows: ({ row: Row; version: number } | null)[];
}

/** One page of the rows holding a value of an indexed column (`Client.find`), in primary key order. */
export interface FindResult<Row> {
  seq: number;
  rows: { row: Row; version: number }[];
  /** More rows may match: pass it as `after` for the next page. */
  next: unknown;
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
  /** One row by primary key, without a query (the WebSocket `get`); null when absent or not readable. */
  get<Row = Record<string, unknown>>(table: string, key: number | string | bigint): Promise<GetResult<Row>>;
  /** Rows by primary key in one request and one reply (the WebSocket `get` by `keys`, at most 1 000 keys): one entry per key, in order, null when absent or not readable. */
  getMany<Row = Record<string, unknown>>(table: string, keys: (number | string | bigint)[]): Promise<GetManyResult<Row>>;
  /** The rows holding `value` in an indexed column (`{column}`) or index (`{index}`), paged by `limit`/`after`. */
  find<Row = Record<string, unknown>>(
    table: string,
    by: { index: string } | { column: string },
    value: unknown,
    options?: { limit?: number; after?: unknown },
  ): Promise<FindResult<Row>>;
  mutate(ops: Op[], options?: { durability?: Durability }): Promise<MutateResult>;
  call<Result = unknown>(name: string, args?: unknown, options?: { durability?: Durability }): Promise<{ seq: number; result: Result }>;
  sql(sql: string, params?: Params, options?: { durability?: Durability }): Promise<SqlReply>;
  /** Any other HTTP endpoint (docs/api.md) with the client's token; a JSON body; errors as SluiceError. */
  http<T = unknown>(method: string, path: string, body?: unknown): Promise<T>;

  /**
   * A live query. `coalesceMs` (0 … 10 000; default 0) asks the server for at most one diff per
   * window: the net change of every commit in it (docs/protocol.md, "Coalescing").
   */
  live<Row = Record<string, unknown>>(sql: string, params?: Params, options?: LiveOptions): LiveQuery<Row>;

  append(
    topic: string,
    records: { tags?: string[]; data?: unknown }[],
    options?: { durability?: Durability },
  ): Promise<{ seq: number; first: number; last: number }>;
  /** `coalesceMs`: records come in batches, at most one per window (none dropped or merged). */
  watch<Data = unknown>(topic: string, options?: WatchOptions): TopicWatch<Data>;

  close(): void;
}

/** Options of a live query. */
export interface LiveOptions {
  /** At most one (folded) diff per this many milliseconds (0 … 10 000; 0: a diff per commit). */
  coalesceMs?: number;
}

/** Options of a topic watch. */
export interface WatchOptions {
  from?: number;
  tags?: string[];
  keep?: number;
  /** Records in batches, at most one per this many milliseconds (0 … 10 000). */
  coalesceMs?: number;
}
