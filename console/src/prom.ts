// Parses the Prometheus text of GET /metrics (crates/server/src/metrics.rs) and turns two
// successive samples into the console's series.

export type Sample = { at: number; values: Map<string, number> };

export function parseMetrics(text: string, at: number): Sample {
  const values = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    if (sp < 0) continue;
    const v = Number(line.slice(sp + 1));
    if (!Number.isNaN(v)) values.set(line.slice(0, sp), v);
  }
  return { at, values };
}

export interface Series {
  id: string;
  label: string;
  unit: string;
  /** Computes the point from the previous and the current sample; null when unknown. */
  point: (prev: Sample | null, cur: Sample) => number | null;
}

const rate = (name: string) => (prev: Sample | null, cur: Sample) => {
  const a = prev?.values.get(name);
  const b = cur.values.get(name);
  if (a === undefined || b === undefined || !prev) return null;
  const dt = (cur.at - prev.at) / 1000;
  return dt > 0 ? Math.max(0, (b - a) / dt) : null;
};
const gauge = (name: string) => (_prev: Sample | null, cur: Sample) => cur.values.get(name) ?? null;

/** Mean fdatasync latency over the interval, in milliseconds (from the histogram's sum/count). */
const fsyncMs = (prev: Sample | null, cur: Sample) => {
  if (!prev) return null;
  const s = (cur.values.get("sluice_log_sync_seconds_sum") ?? 0) - (prev.values.get("sluice_log_sync_seconds_sum") ?? 0);
  const n = (cur.values.get("sluice_log_sync_seconds_count") ?? 0) - (prev.values.get("sluice_log_sync_seconds_count") ?? 0);
  return n > 0 ? (s / n) * 1000 : 0;
};

/**
 * The 99th percentile of fdatasync latency over the interval, in milliseconds: the upper bound
 * of the first histogram bucket (powers of two of µs) whose count since the previous sample
 * reaches 99 % of the syncs in the interval.
 */
const fsyncP99Ms = (prev: Sample | null, cur: Sample) => {
  if (!prev) return null;
  const name = "sluice_log_sync_seconds_bucket{le=\"";
  const buckets: { le: number; n: number }[] = [];
  for (const [k, v] of cur.values) {
    if (!k.startsWith(name)) continue;
    const le = k.slice(name.length, -2);
    buckets.push({ le: le === "+Inf" ? Infinity : Number(le), n: v - (prev.values.get(k) ?? 0) });
  }
  buckets.sort((a, b) => a.le - b.le);
  const total = buckets.length ? buckets[buckets.length - 1].n : 0;
  if (total <= 0) return 0;
  const b = buckets.find((x) => x.n >= 0.99 * total)!;
  return Number.isFinite(b.le) ? b.le * 1000 : null;
};

export const SERIES: Series[] = [
  { id: "commits", label: "commits/s", unit: "/s", point: rate("sluice_commits_total") },
  { id: "syncs", label: "syncs/s", unit: "/s", point: rate("sluice_log_syncs_total") },
  { id: "fsync", label: "fsync latency (mean)", unit: "ms", point: fsyncMs },
  { id: "fsync_p99", label: "fsync latency (p99, bucket bound)", unit: "ms", point: fsyncP99Ms },
  { id: "views", label: "live views", unit: "", point: gauge("sluice_live_views") },
  { id: "subscribers", label: "subscribers", unit: "", point: gauge("sluice_live_subscribers") },
  { id: "handoff", label: "fan-out queue depth", unit: "commits", point: gauge("sluice_live_handoff_commits") },
  { id: "watchers", label: "topic watchers", unit: "", point: gauge("sluice_topic_watchers") },
  { id: "lagging", label: "lagging watchers (cut off)", unit: "total", point: gauge("sluice_topic_lagging_total") },
  { id: "ws", label: "WebSocket connections", unit: "", point: gauge("sluice_ws_connections") },
];
