// What the console's views need of a live result and of a topic tail: the shapes of the SDK's
// `LiveQuery` and `TopicWatch` (sdk/ts/README.md), which feed them over the WebSocket with
// checksums verified and reconnects resumed from the last seq / offset.

export type LiveStatus = "loading" | "live" | "reconnecting" | "error";
type ErrorLike = { code: string; message: string; details?: Record<string, unknown> };

export interface LiveView {
  readonly rows: readonly Record<string, unknown>[];
  readonly columns: string[];
  readonly status: LiveStatus;
  readonly error: ErrorLike | null;
  readonly seq: number;
  subscribe(listener: () => void): () => void;
  close(): void;
}

export interface TopicRecord {
  topic: string;
  offset: number;
  ts: number;
  tags: string[];
  data: unknown;
}

/** Records oldest first, at most `keep` of the newest. */
export interface TopicTail {
  readonly records: readonly TopicRecord[];
  readonly next: number;
  readonly status: LiveStatus;
  readonly error: ErrorLike | null;
  subscribe(listener: () => void): () => void;
  close(): void;
}
