import { SluiceError } from "./errors.js";
import { encode, decode } from "./msgpack.js";
import { parseJson, stringifyJson } from "./json.js";
import { Float, OMap, plain, field, type Wire } from "./wire.js";
import { loadChecksum, rowHash, render, MASK } from "./checksum.js";
import type {
  Client,
  ClientStatus,
  ConnectOptions,
  LiveOptions,
  WatchOptions,
  Durability,
  LiveQuery,
  LiveStatus,
  MutateResult,
  Op,
  Params,
  QueryResult,
  GetResult,
  GetManyResult,
  FindResult,
  SqlReply,
  TokenSource,
  TopicRecord,
  TopicWatch,
} from "./types.js";

interface Socket {
  readyState: number;
  binaryType: string;
  protocol: string;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onclose: ((ev: { code?: number; reason?: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
}
type SocketCtor = new (url: string, protocols?: string | string[]) => Socket;

interface Pending {
  resolve: (m: Wire) => void;
  reject: (e: SluiceError) => void;
  /** The frame sent, to find the request an unattributed `limit` error is about. */
  frame?: string | Uint8Array;
}

interface Waiting {
  msg: Record<string, unknown>;
  pending: Pending;
  timer: ReturnType<typeof setTimeout>;
}

/** Something resubscribed after every (re)connect and fed the events named by its qid. */
interface Stream {
  onOpen(): void;
  onDisconnected(): void;
  /** The client was closed: end with `disconnected`. */
  onClosed(err: SluiceError): void;
  onEvent(m: Wire): void;
}

/** Opens a client; the connection is made in the background (requests wait for it). */
export function connect(options: ConnectOptions): Client {
  return new SluiceClient(options);
}

const utf8 = new TextEncoder();

function disconnected(why: string): SluiceError {
  return new SluiceError("disconnected", why);
}

export class SluiceClient implements Client {
  status: ClientStatus = "connecting";
  private readonly opts: ConnectOptions;
  private token: TokenSource | undefined;
  private ws: Socket | null = null;
  private nextId = 1;
  private nextQid = 1;
  private attempt = 0;
  private closed = false;
  private reconnectTimer: ReturnType<typeof setTimeout> | null = null;
  private heartbeat: ReturnType<typeof setTimeout> | null = null;
  private readonly inflight = new Map<number, Pending>();
  private waiting: Waiting[] = [];
  private readonly statusListeners = new Set<(s: ClientStatus) => void>();
  /** qid → stream, for live queries and watches. */
  readonly streams = new Map<string, Stream>();
  /** topic → watch (the server allows one watch per topic per connection). */
  readonly watches = new Map<string, TopicWatchImpl<unknown>>();
  private readonly live_ = new Set<Stream>();

  private readonly Socket: SocketCtor;

  constructor(options: ConnectOptions) {
    this.opts = options;
    this.token = options.token;
    const Ctor = (options.WebSocket ?? (globalThis as { WebSocket?: unknown }).WebSocket) as SocketCtor | undefined;
    if (typeof Ctor !== "function")
      throw new SluiceError("bad_request", 'no WebSocket implementation: pass options.WebSocket (in Node 20, e.g. the "ws" package\'s default export)');
    this.Socket = Ctor;
    let base: URL;
    try {
      // In a browser a relative url ("" or "/") means the page's own server.
      base = new URL(options.url || "/", (globalThis as { location?: { href: string } }).location?.href);
    } catch {
      throw new SluiceError("bad_request", `url must be http(s)://host:port, got ${JSON.stringify(options.url)}`);
    }
    if (base.protocol !== "http:" && base.protocol !== "https:")
      throw new SluiceError("bad_request", `url must be http(s)://host:port, got ${JSON.stringify(options.url)}`);
    this.baseUrl = base.origin + base.pathname.replace(/\/+$/, "");
    void this.open();
  }

  get encoding() {
    return this.opts.encoding ?? "msgpack";
  }
  get hooks() {
    return this.opts.testHooks;
  }

  onStatus(listener: (status: ClientStatus) => void): () => void {
    this.statusListeners.add(listener);
    return () => this.statusListeners.delete(listener);
  }

  setToken(token: TokenSource): void {
    this.token = token;
  }

  private setStatus(s: ClientStatus) {
    if (this.status === s) return;
    this.status = s;
    for (const l of [...this.statusListeners]) l(s);
  }

  private async currentToken(): Promise<string | undefined> {
    const t = this.token;
    if (t === undefined) return undefined;
    return typeof t === "function" ? await t() : t;
  }

  private readonly baseUrl: string;
  private base(): string {
    return this.baseUrl;
  }

  private async open(): Promise<void> {
    if (this.closed) return;
    let token: string | undefined;
    try {
      await loadChecksum();
      await this.opts.testHooks?.beforeConnect?.();
      if (this.closed) return;
      token = await this.currentToken();
    } catch (e) {
      console.warn("sluice-client: cannot connect (getting the token failed):", e);
      return this.scheduleReconnect();
    }
    if (this.closed) return;
    const Ctor = this.Socket;
    const url = new URL(this.base() + "/v1/ws");
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (token) url.searchParams.set("access_token", token);
    const proto = this.encoding === "json" ? "sluice.json.v1" : "sluice.msgpack.v1";
    let ws: Socket;
    try {
      ws = new Ctor(url.toString(), [proto]);
    } catch (e) {
      console.warn("sluice-client: cannot open the WebSocket:", e);
      return this.scheduleReconnect();
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      opened = true;
      this.attempt = 0;
      this.startHeartbeat(ws);
      this.setStatus("open");
      for (const s of [...this.live_]) s.onOpen();
      const waiting = this.waiting;
      this.waiting = [];
      for (const w of waiting) {
        clearTimeout(w.timer);
        this.sendNow(w.msg, w.pending);
      }
    };
    ws.onmessage = (ev) => {
      if (this.ws !== ws) return;
      let m: unknown;
      try {
        const d = ev.data;
        m = typeof d === "string" ? parseJson(d) : decode(d instanceof Uint8Array ? d : new Uint8Array(d as ArrayBuffer));
      } catch (e) {
        console.warn("sluice-client: dropping a malformed message:", e);
        return;
      }
      if (!(m instanceof OMap)) return console.warn("sluice-client: dropping a message that is not a map");
      this.dispatch(m);
    };
    ws.onerror = () => {};
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      const why = `the connection closed${ev?.code ? ` (${ev.code}${ev.reason ? ` ${ev.reason}` : ""})` : ""}`;
      const inflight = [...this.inflight.values()];
      this.inflight.clear();
      for (const p of inflight) p.reject(disconnected(why + " before the reply came"));
      for (const s of [...this.live_]) s.onDisconnected();
      this.scheduleReconnect();
      if (!opened) this.diagnose();
    };
  }

  /**
   * A WebSocket that never opened says nothing about why (a browser hides the HTTP status):
   * ask over HTTP with the same token, and fail the waiting requests with a refusal
   * (`unauthorized`, `forbidden`) instead of letting them time out as `disconnected`.
   */
  private diagnose() {
    this.http("GET", "/v1/tables").then(
      () => {},
      (e: SluiceError) => {
        if (e.code !== "unauthorized" && e.code !== "forbidden") return;
        const waiting = this.waiting;
        this.waiting = [];
        for (const w of waiting) (clearTimeout(w.timer), w.pending.reject(e));
      },
    );
  }

  /**
   * A connection can die without a close (a laptop sleeps, a NAT forgets): every
   * `heartbeatMs` a ping; no reply within `heartbeatMs` more drops the socket and reconnects.
   */
  private startHeartbeat(ws: Socket) {
    const every = this.opts.heartbeatMs ?? 20_000;
    if (!(every > 0)) return;
    const beat = () => {
      if (this.ws !== ws) return;
      let answered = false;
      const deadline = setTimeout(() => {
        if (!answered && this.ws === ws) this.dropConnection(`no pong within ${every} ms`);
      }, every);
      this.request({ type: "ping" }).then(
        () => {
          answered = true;
          clearTimeout(deadline);
          if (this.ws === ws) this.heartbeat = setTimeout(beat, every);
        },
        () => clearTimeout(deadline),
      );
    };
    if (this.heartbeat) clearTimeout(this.heartbeat);
    this.heartbeat = setTimeout(beat, every);
  }

  private scheduleReconnect() {
    if (this.closed) return;
    this.setStatus("reconnecting");
    const initial = this.opts.reconnect?.initialDelayMs ?? 100;
    const max = this.opts.reconnect?.maxDelayMs ?? 5000;
    const d = Math.min(max, initial * 2 ** Math.min(this.attempt, 30));
    this.attempt++;
    const delay = d / 2 + (Math.random() * d) / 2;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      void this.open();
    }, delay);
  }

  private dispatch(m: Wire) {
    const type = m.get("type");
    const id = m.get("id");
    const qid = m.get("qid");
    if (type === "record") {
      const w = this.watches.get(String(m.get("topic")));
      if (w) w.onEvent(m);
      return;
    }
    if (type === "watching" && qid !== undefined && qid !== null) {
      // Handled at once, not in a promise callback: the records that follow may be dispatched
      // from the same socket read, before any microtask runs.
      this.streams.get(String(qid))?.onEvent(m);
    }
    if (typeof id === "number" && this.inflight.has(id)) {
      const p = this.inflight.get(id)!;
      this.inflight.delete(id);
      if (type === "error") p.reject(SluiceError.from(plain(m.get("error"))));
      else p.resolve(m);
      return;
    }
    if (qid !== undefined && qid !== null) {
      const s = this.streams.get(String(qid));
      if (s) s.onEvent(m);
      return;
    }
    if (type === "error") {
      const err = SluiceError.from(plain(m.get("error")));
      // A frame over --max-body-bytes is refused before its id is read ("id": null); the
      // message names the frame's size, which finds the request it was.
      const size = /message of (\d+) bytes/.exec(err.message)?.[1];
      if (err.code === "limit" && size) {
        for (const [pid, p] of this.inflight) {
          const f = p.frame;
          const len = f === undefined ? -1 : typeof f === "string" ? utf8.encode(f).length : f.length;
          if (len === Number(size)) {
            this.inflight.delete(pid);
            return p.reject(err);
          }
        }
      }
      console.warn("sluice-client: error from the server:", err.code, err.message);
    }
  }

  private encodeMsg(msg: Record<string, unknown>): string | Uint8Array {
    return this.encoding === "json" ? stringifyJson(msg) : encode(msg);
  }

  private sendNow(msg: Record<string, unknown>, pending: Pending | null) {
    const ws = this.ws!;
    let data: string | Uint8Array;
    try {
      data = this.encodeMsg(msg);
    } catch (e) {
      pending?.reject(e instanceof SluiceError ? e : new SluiceError("bad_request", String(e)));
      return;
    }
    if (pending) {
      pending.frame = data;
      this.inflight.set(msg.id as number, pending);
    }
    ws.send(data);
  }

  /** Sends a message that is not answered by id (subscribe, unsubscribe): only when open. */
  sendIfOpen(msg: Record<string, unknown>): boolean {
    if (!this.ws || this.ws.readyState !== 1) return false;
    this.sendNow({ id: this.nextId++, ...msg }, null);
    return true;
  }

  get isOpen() {
    return !!this.ws && this.ws.readyState === 1;
  }

  get isClosed() {
    return this.closed;
  }

  /** Sends a request and resolves with its reply; waits (bounded) for the connection. */
  request(msg: Record<string, unknown>): Promise<Wire> {
    return new Promise<Wire>((resolve, reject) => {
      if (this.closed) return reject(disconnected("the client is closed"));
      const full = { id: this.nextId++, ...msg };
      const pending = { resolve, reject };
      if (this.isOpen) return this.sendNow(full, pending);
      const ms = this.opts.requestTimeoutMs ?? 10_000;
      const w: Waiting = {
        msg: full,
        pending,
        timer: setTimeout(() => {
          this.waiting = this.waiting.filter((x) => x !== w);
          reject(disconnected(`not connected to ${this.base()} within ${ms} ms`));
        }, ms),
      };
      this.waiting.push(w);
    });
  }

  newQid(prefix: string): string {
    return `${prefix}${this.nextQid++}`;
  }
  addStream(s: Stream) {
    this.live_.add(s);
  }
  removeStream(s: Stream) {
    this.live_.delete(s);
  }

  async query<Row = Record<string, unknown>>(sql: string, params?: Params): Promise<QueryResult<Row>> {
    const m = await this.request({ type: "query", sql, ...(params !== undefined ? { params } : {}) });
    const columns = field(m, "columns") as string[];
    return {
      seq: field(m, "seq") as number,
      columns,
      types: (field(m, "types") as (string | null)[] | undefined) ?? columns.map(() => null),
      rows: field(m, "rows") as Row[],
    };
  }

  async get<Row = Record<string, unknown>>(table: string, key: number | string | bigint): Promise<GetResult<Row>> {
    const m = await this.request({ type: "get", table, key });
    return { seq: field(m, "seq") as number, row: (field(m, "row") ?? null) as Row | null, version: (field(m, "version") ?? null) as number | null };
  }

  async getMany<Row = Record<string, unknown>>(table: string, keys: (number | string | bigint)[]): Promise<GetManyResult<Row>> {
    const m = await this.request({ type: "get", table, keys });
    return { seq: field(m, "seq") as number, rows: field(m, "rows") as GetManyResult<Row>["rows"] };
  }

  async find<Row = Record<string, unknown>>(
    table: string,
    by: { index: string } | { column: string },
    value: unknown,
    options?: { limit?: number; after?: unknown },
  ): Promise<FindResult<Row>> {
    const m = await this.request({
      type: "get",
      table,
      ...by,
      value,
      ...(options?.limit !== undefined ? { limit: options.limit } : {}),
      ...(options?.after !== undefined ? { after: options.after } : {}),
    });
    return { seq: field(m, "seq") as number, rows: field(m, "rows") as FindResult<Row>["rows"], next: field(m, "next") ?? null };
  }

  async mutate(ops: Op[], options?: { durability?: Durability }): Promise<MutateResult> {
    const m = await this.request({ type: "mutate", ops, ...(options?.durability ? { durability: options.durability } : {}) });
    return { seq: field(m, "seq") as number, results: field(m, "results") as MutateResult["results"] };
  }

  async call<Result = unknown>(name: string, args?: unknown, options?: { durability?: Durability }): Promise<{ seq: number; result: Result }> {
    const m = await this.request({
      type: "call",
      name,
      args: args ?? null,
      ...(options?.durability ? { durability: options.durability } : {}),
    });
    return { seq: field(m, "seq") as number, result: field(m, "result") as Result };
  }

  async append(
    topic: string,
    records: { tags?: string[]; data?: unknown }[],
    options?: { durability?: Durability },
  ): Promise<{ seq: number; first: number; last: number }> {
    const m = await this.request({ type: "append", topic, records, ...(options?.durability ? { durability: options.durability } : {}) });
    return { seq: field(m, "seq") as number, first: field(m, "first") as number, last: field(m, "last") as number };
  }

  /** An HTTP request to the server with the client's token; errors become SluiceError. */
  async http<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    const f = this.opts.fetch ?? globalThis.fetch;
    const token = await this.currentToken();
    const headers: Record<string, string> = {};
    if (token) headers.authorization = `Bearer ${token}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    let res: Response;
    try {
      res = await f(this.base() + path, { method, headers, body: body === undefined ? undefined : stringifyJson(body) });
    } catch (e) {
      throw new SluiceError("disconnected", `${method} ${path}: ${(e as Error)?.message ?? e}`);
    }
    const text = await res.text();
    let json: unknown;
    try {
      json = text ? plain(parseJson(text)) : null;
    } catch {
      throw new SluiceError(res.ok ? "protocol" : "http", `${method} ${path}: HTTP ${res.status}: ${text.slice(0, 200)}`, {}, res.status);
    }
    if (!res.ok) {
      const err = (json as { error?: unknown } | null)?.error;
      throw err ? SluiceError.from(err, res.status) : new SluiceError("http", `${method} ${path}: HTTP ${res.status}`, {}, res.status);
    }
    return json as T;
  }

  sql(sql: string, params?: Params, options?: { durability?: Durability }): Promise<SqlReply> {
    return this.http<SqlReply>("POST", "/v1/sql", {
      sql,
      ...(params !== undefined ? { params } : {}),
      ...(options?.durability ? { durability: options.durability } : {}),
    });
  }

  live<Row = Record<string, unknown>>(sql: string, params?: Params, options?: LiveOptions): LiveQuery<Row> {
    return new LiveQueryImpl<Row>(this, sql, params, options?.coalesceMs);
  }

  watch<Data = unknown>(topic: string, options?: WatchOptions): TopicWatch<Data> {
    return new TopicWatchImpl<Data>(this, topic, options ?? {});
  }

  /** Drops the socket as a network failure would (the client reconnects); also a test hook. */
  dropConnection(reason = "dropped by the client"): void {
    const ws = this.ws;
    if (!ws) return;
    ws.onclose?.({ code: 1006, reason });
    ws.onclose = ws.onmessage = ws.onopen = null;
    ws.close();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    if (this.heartbeat) clearTimeout(this.heartbeat);
    const ws = this.ws;
    this.ws = null;
    ws?.close(1000, "client closed");
    const err = disconnected("the client is closed");
    for (const p of this.inflight.values()) p.reject(err);
    this.inflight.clear();
    for (const w of this.waiting) (clearTimeout(w.timer), w.pending.reject(err));
    this.waiting = [];
    for (const s of [...this.live_]) s.onClosed(err);
    this.setStatus("closed");
  }
}

/** Keys compare by their JSON text (a key is a scalar or an array of scalars). */
function keyText(k: unknown): string {
  return JSON.stringify(plain(k), (_k, v) => (typeof v === "bigint" ? v.toString() : v));
}

/** Fresh snapshots tried after a checksum mismatch before the query ends with `checksum`. */
const MAX_RESYNCS = 2;

/** Codes after which the SDK subscribes again by itself instead of ending the subscription. */
const RESUBSCRIBE = new Set(["rules_changed", "slow_subscriber", "shutting_down"]);

export class LiveQueryImpl<Row> implements LiveQuery<Row> {
  rows: readonly Row[] = [];
  status: LiveStatus = "loading";
  error: SluiceError | null = null;
  seq = 0;
  columns: string[] = [];
  types: (string | null)[] | null = null;
  /** Checksum mismatches seen (each one resubscribed). */
  checksumMismatches = 0;
  /** Events whose checksum was verified. */
  checksumsVerified = 0;
  /** Seqs of the last 1000–2000 events applied, in order (for tests and debugging). */
  readonly appliedSeqs: number[] = [];
  private keys: string[] = [];
  private hashes: bigint[] = [];
  private sum = 0n;
  private verify = false;
  private qid: string | null = null;
  private closed = false;
  private fresh = false;
  /** Consecutive events that failed to apply or verify. */
  private failures = 0;
  /**
   * The chunks of a large snapshot received so far (docs/protocol.md, "Large snapshots"):
   * every chunk but the last says `more: true`; the rows are applied, and the checksum
   * verified, only when the last one arrives.
   */
  private chunks: { seq: unknown; keys: unknown[]; rows: unknown[] } | null = null;
  private readonly listeners = new Set<() => void>();

  constructor(
    private readonly client: SluiceClient,
    readonly sql: string,
    readonly params: Params | undefined,
    readonly coalesceMs: number | undefined = undefined,
  ) {
    if (client.isClosed) {
      this.status = "error";
      this.error = disconnected("the client is closed");
      return;
    }
    client.addStream(this);
    if (client.isOpen) this.onOpen();
  }

  subscribe(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private notify() {
    for (const l of [...this.listeners]) l();
  }

  onClosed(err: SluiceError) {
    if (this.closed || this.status === "error") return;
    if (this.qid) this.client.streams.delete(this.qid);
    this.qid = null;
    this.status = "error";
    this.error = err;
    this.client.removeStream(this);
    this.notify();
  }

  private start(since: number | null) {
    this.chunks = null;
    if (this.qid) this.client.streams.delete(this.qid);
    this.qid = this.client.newQid("q");
    this.client.streams.set(this.qid, this);
    this.client.sendIfOpen({
      type: "subscribe",
      qid: this.qid,
      sql: this.sql,
      ...(this.params !== undefined ? { params: this.params } : {}),
      ...(since !== null ? { since } : {}),
      ...(this.coalesceMs ? { coalesce_ms: this.coalesceMs } : {}),
    });
  }

  onOpen() {
    if (this.closed || this.status === "error") return;
    const since = this.seq > 0 && !this.fresh ? this.seq : null;
    this.start(since);
  }

  onDisconnected() {
    this.chunks = null;
    if (this.qid) this.client.streams.delete(this.qid);
    this.qid = null;
    if (this.closed || this.status === "error") return;
    if (this.status !== "reconnecting") {
      this.status = this.seq > 0 ? "reconnecting" : "loading";
      this.notify();
    }
  }

  onEvent(m: Wire) {
    if (this.closed) return;
    const type = m.get("type");
    if (type === "error") return this.onError(SluiceError.from(plain(m.get("error"))));
    if (type !== "snapshot" && type !== "diff") return;
    if (type === "snapshot") {
      const whole = this.assemble(m);
      if (!whole) return;
      m = whole;
    } else if (this.chunks) {
      // A diff before the snapshot it follows ended: the server never sends one.
      console.warn(`sluice-client: live query ${JSON.stringify(this.sql)}: a diff inside a chunked snapshot; subscribing again`);
      return this.resync();
    }
    this.client.hooks?.beforeApply?.(m);
    try {
      if (type === "snapshot") this.applySnapshot(m);
      else this.applyDiff(m);
    } catch (e) {
      const err = e instanceof SluiceError ? e : new SluiceError("protocol", String(e));
      // A fresh snapshot that does not add up either will not after another try: stop there.
      if (++this.failures > MAX_RESYNCS) {
        console.warn(`sluice-client: live query ${JSON.stringify(this.sql)}: ${err.message}; giving up after ${MAX_RESYNCS} fresh snapshots`);
        return this.onError(err);
      }
      console.warn(`sluice-client: live query ${JSON.stringify(this.sql)}: ${err.message}; subscribing again`);
      this.resync();
      return;
    }
    this.failures = 0;
    const seq = m.get("seq") as number;
    this.seq = seq;
    this.appliedSeqs.push(seq);
    if (this.appliedSeqs.length > 2000) this.appliedSeqs.splice(0, 1000);
    this.fresh = false;
    this.status = "live";
    this.error = null;
    this.notify();
  }

  private onError(err: SluiceError) {
    if (this.qid) {
      if (err.code === "checksum" || err.code === "protocol") this.client.sendIfOpen({ type: "unsubscribe", qid: this.qid });
      this.client.streams.delete(this.qid);
    }
    this.qid = null;
    if (RESUBSCRIBE.has(err.code)) {
      if (err.code !== "shutting_down") this.start(this.seq > 0 ? this.seq : null);
      return;
    }
    this.status = "error";
    this.error = err;
    this.client.removeStream(this);
    this.notify();
  }

  /** Drops what we hold and subscribes again from seq 0 (a full snapshot); rows stay visible. */
  private resync() {
    if (this.qid) {
      this.client.sendIfOpen({ type: "unsubscribe", qid: this.qid });
      this.client.streams.delete(this.qid);
    }
    this.fresh = true;
    this.status = "reconnecting";
    this.notify();
    if (this.client.isOpen) this.start(null);
  }

  private check(m: Wire) {
    if (!this.verify) return;
    const want = m.get("checksum");
    const got = render(this.sum);
    this.checksumsVerified++;
    if (typeof want === "string" && want !== got) {
      this.checksumMismatches++;
      throw new SluiceError("checksum", `checksum mismatch at seq ${m.get("seq")}: the server says ${want}, the rows held hash to ${got}`, {
        seq: m.get("seq"),
        expected: want,
        actual: got,
      });
    }
  }

  /**
   * Collects a chunked snapshot: `null` while chunks are still to come, else the whole
   * snapshot as one message (the last chunk's fields, every chunk's keys and rows in order).
   * A snapshot of one message is returned as it is.
   */
  private assemble(m: Wire): Wire | null {
    const more = m.get("more") === true;
    const keys = (m.get("keys") as unknown[]) ?? [];
    const rows = (m.get("rows") as unknown[]) ?? [];
    let chunks = this.chunks;
    // A chunk of another seq starts a new snapshot (the previous one was cut short).
    if (chunks && chunks.seq !== m.get("seq")) chunks = null;
    if (more) {
      if (!chunks) chunks = { seq: m.get("seq"), keys: [], rows: [] };
      for (const k of keys) chunks.keys.push(k);
      for (const r of rows) chunks.rows.push(r);
      this.chunks = chunks;
      return null;
    }
    this.chunks = null;
    if (!chunks) return m;
    for (const k of keys) chunks.keys.push(k);
    for (const r of rows) chunks.rows.push(r);
    const names = m.keys.slice();
    const values = m.values.slice();
    values[names.indexOf("keys")] = chunks.keys;
    values[names.indexOf("rows")] = chunks.rows;
    return new OMap(names, values);
  }

  private applySnapshot(m: Wire) {
    this.columns = field(m, "columns") as string[];
    const types =
      (field(m, "types") as (string | null)[] | undefined) ?? this.client.hooks?.assumeTypes?.(this.sql, this.columns);
    this.types = types ?? null;
    this.verify = !!types && typeof m.get("checksum") === "string";
    const wireRows = (m.get("rows") as unknown[]) ?? [];
    const keys = (m.get("keys") as unknown[]) ?? [];
    const rows: Row[] = new Array(wireRows.length);
    const hashes: bigint[] = this.verify ? new Array(wireRows.length) : [];
    let sum = 0n;
    for (let i = 0; i < wireRows.length; i++) {
      rows[i] = plain(wireRows[i]) as Row;
      if (this.verify) {
        const h = rowHash(wireRows[i], this.columns, types!);
        hashes[i] = h;
        sum += h;
      }
    }
    this.sum = sum & MASK;
    this.check(m);
    this.keys = keys.map(keyText);
    this.hashes = hashes;
    this.rows = rows;
  }

  private applyDiff(m: Wire) {
    if (this.seq === 0 && this.rows.length === 0 && this.columns.length === 0)
      throw new SluiceError("protocol", "a diff before any snapshot");
    const seq = m.get("seq") as number;
    if (seq <= this.seq) throw new SluiceError("protocol", `a diff at seq ${seq} after seq ${this.seq}`);
    const changes = (m.get("changes") as OMap[]) ?? [];
    const before = { rows: this.rows, keys: this.keys, hashes: this.hashes, sum: this.sum };
    try {
      if (changes.some((c) => typeof c.get("index") === "number")) this.applyOrdered(changes);
      else this.applyUnordered(changes);
      this.check(m);
    } catch (e) {
      // Keep showing the rows as they were before the event that did not add up.
      Object.assign(this, before);
      throw e;
    }
  }

  /** An ordered view: apply the changes in order at their indexes. */
  private applyOrdered(changes: OMap[]) {
    const rows = this.rows.slice() as Row[];
    const keys = this.keys.slice();
    const hashes = this.verify ? this.hashes.slice() : this.hashes;
    let sum = this.sum;
    const find = (k: string, index: unknown) => {
      if (typeof index === "number" && keys[index] === k) return index;
      const i = keys.indexOf(k);
      if (i < 0) throw new SluiceError("protocol", `a diff removes key ${k}, which is not held`);
      return i;
    };
    for (const c of changes) {
      const op = c.get("op");
      const k = keyText(c.get("key"));
      const index = c.get("index");
      let at: number | null = null;
      if (op === "remove" || op === "change") {
        at = find(k, op === "remove" ? index : undefined);
        rows.splice(at, 1);
        keys.splice(at, 1);
        if (this.verify) sum -= hashes.splice(at, 1)[0];
      }
      if (op === "add" || op === "change") {
        const wireRow = c.get("row");
        const pos = typeof index === "number" ? index : at ?? rows.length;
        if (pos > rows.length) throw new SluiceError("protocol", `a diff adds at index ${pos} beyond ${rows.length} rows`);
        rows.splice(pos, 0, plain(wireRow) as Row);
        keys.splice(pos, 0, k);
        if (this.verify) {
          const h = rowHash(wireRow, this.columns, this.types!);
          hashes.splice(pos, 0, h);
          sum += h;
        }
      } else if (op !== "remove") throw new SluiceError("protocol", `unknown change op ${String(op)}`);
    }
    this.sum = sum & MASK;
    this.rows = rows;
    this.keys = keys;
    this.hashes = hashes;
  }

  /**
   * An unordered view is a set keyed by key: one pass over the held rows, O(rows + changes),
   * keeping the order of the rows that stay; new rows go at the end, changed ones stay put.
   */
  private applyUnordered(changes: OMap[]) {
    type Entry = { row: Row; hash: bigint };
    const held = new Map<string, number>();
    for (let i = 0; i < this.keys.length; i++) held.set(this.keys[i], i);
    const overrides = new Map<string, Entry | null>(); // held key → new row, or null: removed
    const added = new Map<string, Entry>(); // keys not held before, in order
    const entry = (c: OMap): Entry => {
      const wireRow = c.get("row");
      return { row: plain(wireRow) as Row, hash: this.verify ? rowHash(wireRow, this.columns, this.types!) : 0n };
    };
    const isHeld = (k: string) => held.has(k) && overrides.get(k) !== null;
    for (const c of changes) {
      const op = c.get("op");
      const k = keyText(c.get("key"));
      if (op === "remove") {
        if (added.has(k)) added.delete(k);
        else if (isHeld(k)) overrides.set(k, null);
        else throw new SluiceError("protocol", `a diff removes key ${k}, which is not held`);
      } else if (op === "add") {
        if (added.has(k) || isHeld(k)) throw new SluiceError("protocol", `a diff adds key ${k}, which is already held`);
        added.set(k, entry(c)); // (a held key removed earlier in this diff stays removed: its override is null)
      } else if (op === "change") {
        if (added.has(k)) added.set(k, entry(c));
        else if (isHeld(k)) overrides.set(k, entry(c));
        else throw new SluiceError("protocol", `a diff changes key ${k}, which is not held`);
      } else throw new SluiceError("protocol", `unknown change op ${String(op)}`);
    }
    const rows: Row[] = [];
    const keys: string[] = [];
    const hashes: bigint[] = [];
    let sum = this.sum;
    for (let i = 0; i < this.keys.length; i++) {
      const k = this.keys[i];
      const o = overrides.get(k);
      if (o === undefined) {
        rows.push(this.rows[i]);
        keys.push(k);
        if (this.verify) hashes.push(this.hashes[i]);
        continue;
      }
      if (this.verify) sum -= this.hashes[i];
      if (o === null) continue;
      rows.push(o.row);
      keys.push(k);
      if (this.verify) (hashes.push(o.hash), (sum += o.hash));
    }
    for (const [k, e] of added) {
      rows.push(e.row);
      keys.push(k);
      if (this.verify) (hashes.push(e.hash), (sum += e.hash));
    }
    this.sum = sum & MASK;
    this.rows = rows;
    this.keys = keys;
    this.hashes = hashes;
  }


  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.qid) {
      this.client.sendIfOpen({ type: "unsubscribe", qid: this.qid });
      this.client.streams.delete(this.qid);
    }
    this.qid = null;
    this.client.removeStream(this);
    this.listeners.clear();
  }
}

export class TopicWatchImpl<Data> implements TopicWatch<Data> {
  records: readonly TopicRecord<Data>[] = [];
  next: number;
  status: LiveStatus = "loading";
  error: SluiceError | null = null;
  private known: boolean;
  /** Whether the current watch's `watching` reply came: records before it belong to an older watch. */
  private registered = false;
  private qid: string | null = null;
  private closed = false;
  private readonly keep: number;
  private readonly tags: string[] | undefined;
  private readonly coalesceMs: number | undefined;
  private readonly listeners = new Set<(r?: TopicRecord<Data>) => void>();

  constructor(
    private readonly client: SluiceClient,
    readonly topic: string,
    options: WatchOptions,
  ) {
    this.coalesceMs = options.coalesceMs;
    this.next = options.from ?? 0;
    this.known = options.from !== undefined;
    this.keep = options.keep ?? 1000;
    this.tags = options.tags;
    if (client.isClosed) {
      this.status = "error";
      this.error = disconnected("the client is closed");
      return;
    }
    if (client.watches.has(topic)) {
      this.status = "error";
      this.error = new SluiceError("already_exists", `topic ${topic} is already watched on this connection (one watch per topic)`);
      return;
    }
    client.watches.set(topic, this as TopicWatchImpl<unknown>);
    client.addStream(this);
    if (client.isOpen) this.onOpen();
  }

  subscribe(listener: (record?: TopicRecord<Data>) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private notify(r?: TopicRecord<Data>) {
    for (const l of [...this.listeners]) l(r);
  }

  onClosed(err: SluiceError) {
    if (this.closed || this.status === "error") return;
    if (this.qid) this.client.streams.delete(this.qid);
    this.qid = null;
    this.status = "error";
    this.error = err;
    this.client.watches.delete(this.topic);
    this.client.removeStream(this);
    this.notify();
  }

  private start() {
    if (this.qid) this.client.streams.delete(this.qid);
    const qid = this.client.newQid("w");
    this.qid = qid;
    this.registered = false;
    this.client.streams.set(qid, this);
    this.client
      .request({
        type: "watch",
        qid,
        topic: this.topic,
        ...(this.known ? { from: this.next } : {}),
        ...(this.tags ? { tags: this.tags } : {}),
        ...(this.coalesceMs ? { coalesce_ms: this.coalesceMs } : {}),
      })
      .then(
        () => {}, // the `watching` reply is handled in onEvent, synchronously
        (e: SluiceError) => {
          if (this.qid !== qid || this.closed) return;
          this.onError(e);
        },
      );
  }

  onOpen() {
    if (this.closed || this.status === "error") return;
    this.start();
  }

  onDisconnected() {
    if (this.qid) this.client.streams.delete(this.qid);
    this.qid = null;
    if (this.closed || this.status === "error") return;
    this.status = "reconnecting";
    this.notify();
  }

  onEvent(m: Wire) {
    if (this.closed) return;
    const type = m.get("type");
    if (type === "error") {
      if (m.get("qid") !== this.qid) return;
      return this.onError(SluiceError.from(plain(m.get("error"))));
    }
    if (type === "watching") {
      if (m.get("qid") !== this.qid) return;
      this.registered = true;
      const next = m.get("next") as number;
      if (!this.known || next > this.next) this.next = next;
      this.known = true;
      this.status = "live";
      this.notify();
      return;
    }
    if (type !== "record" || !this.registered) return;
    const offset = m.get("offset") as number;
    if (this.known && offset < this.next) return; // already seen (never twice)
    const r = {
      topic: m.get("topic") as string,
      offset,
      ts: plain(m.get("ts")) as number,
      tags: (plain(m.get("tags")) as string[]) ?? [],
      data: plain(m.get("data")) as Data,
    };
    const records = this.records.length >= this.keep ? this.records.slice(this.records.length - this.keep + 1) : this.records.slice();
    records.push(r);
    this.records = records;
    this.next = offset + 1;
    this.known = true;
    if (this.status !== "live") this.status = "live";
    this.notify(r);
  }

  private onError(err: SluiceError) {
    if (this.qid) this.client.streams.delete(this.qid);
    this.qid = null;
    const d = err.details;
    if (err.code === "lagging" && typeof d.next === "number") {
      this.next = d.next;
      this.known = true;
      return this.start();
    }
    if (err.code === "horizon" && typeof d.first === "number") {
      // A gap: records before `first` are gone. Say so, and go on from there.
      this.error = err;
      this.next = d.first;
      this.known = true;
      this.notify();
      return this.start();
    }
    if (err.code === "shutting_down" || err.code === "disconnected") return;
    this.status = "error";
    this.error = err;
    this.client.watches.delete(this.topic);
    this.client.removeStream(this);
    this.notify();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.qid) {
      this.client.sendIfOpen({ type: "unwatch", qid: this.qid });
      this.client.streams.delete(this.qid);
    }
    this.qid = null;
    if (this.client.watches.get(this.topic) === (this as TopicWatchImpl<unknown>)) this.client.watches.delete(this.topic);
    this.client.removeStream(this);
    this.listeners.clear();
  }
}

export { Float, OMap };
