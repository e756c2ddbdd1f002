import assert from "node:assert/strict";

/** JSON text with sorted keys; bigint and Uint8Array spelled out (for comparing rows). */
export function canon(v) {
  if (typeof v === "bigint") return `${v}n`;
  if (v instanceof Uint8Array) return `bytes(${[...v].join(",")})`;
  if (Array.isArray(v)) return `[${v.map(canon).join(",")}]`;
  if (v && typeof v === "object") return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canon(v[k])}`).join(",")}}`;
  return Object.is(v, -0) ? "-0" : JSON.stringify(v);
}

/** Rows in a canonical order, for views whose order the query does not fix. */
export function sorted(rows) {
  return rows.map(canon).sort();
}

/** Waits until `live.rows` equals a one-shot query of the same SQL (re-queried on every try). */
export async function convergeTo(db, live, sql, params, { ordered, label, ms = 10_000 }) {
  const t0 = Date.now();
  let last;
  for (;;) {
    const q = await db.query(sql, params);
    const want = ordered ? q.rows.map(canon) : sorted(q.rows);
    const got = ordered ? live.rows.map(canon) : sorted(live.rows);
    if (live.status === "live" && JSON.stringify(want) === JSON.stringify(got)) {
      assert.ok(live.seq <= q.seq, `${label}: live seq ${live.seq} is ahead of the query's ${q.seq}`);
      return q;
    }
    last = { status: live.status, error: live.error?.message, seq: live.seq, qseq: q.seq, want, got };
    if (Date.now() - t0 > ms) assert.fail(`${label}: live rows never equalled the query within ${ms} ms: ${JSON.stringify(last, null, 1)}`);
    await new Promise((r) => setTimeout(r, 15));
  }
}
