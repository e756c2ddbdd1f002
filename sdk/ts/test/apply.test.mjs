// Applying snapshots and diffs (docs/protocol.md, "Applying a diff") without a server: a stub
// client feeds events straight into a live query; the checksums are computed here, so every
// event is also verified.

import { test } from "node:test";
import assert from "node:assert/strict";
import { LiveQueryImpl } from "../dist/client.js";
import { OMap } from "../dist/wire.js";
import { loadChecksum, rowHash, render } from "../dist/checksum.js";

await loadChecksum();
const COLS = ["id", "v"];
const TYPES = ["integer", "text"];
const row = (id, v) => new OMap(COLS, [id, v]);
const sum = (rows) => render(rows.reduce((s, [id, v]) => s + rowHash(row(id, v), COLS, TYPES), 0n));

function stub() {
  return { streams: new Map(), isOpen: false, isClosed: false, hooks: undefined, addStream() {}, removeStream() {}, sendIfOpen() { return false; }, newQid: () => "q" };
}
const msg = (o) => new OMap(Object.keys(o), Object.values(o));
const change = (op, key, extra = {}) => msg({ op, key, ...extra });

function feed(live, events) {
  const warn = console.warn;
  const warnings = [];
  console.warn = (...a) => warnings.push(a.join(" "));
  try {
    for (const e of events) live.onEvent(e);
  } finally {
    console.warn = warn;
  }
  return warnings;
}

test("unordered diffs: remove, add, change, re-add in one diff; order of kept rows preserved", () => {
  const live = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  const w = feed(live, [
    msg({ type: "snapshot", seq: 1, columns: COLS, types: TYPES, keys: [1, 2, 3], rows: [row(1, "a"), row(2, "b"), row(3, "c")], checksum: sum([[1, "a"], [2, "b"], [3, "c"]]) }),
    msg({
      type: "diff",
      seq: 2,
      changes: [change("remove", 2), change("add", 4, { row: row(4, "d") }), change("change", 1, { row: row(1, "A") }), change("remove", 3), change("add", 3, { row: row(3, "C") }), change("change", 4, { row: row(4, "D") })],
      checksum: sum([[1, "A"], [3, "C"], [4, "D"]]),
    }),
  ]);
  assert.deepEqual(w, []);
  assert.deepEqual(live.rows, [{ id: 1, v: "A" }, { id: 4, v: "D" }, { id: 3, v: "C" }]);
  assert.equal(live.seq, 2);
  assert.equal(live.status, "live");
  assert.equal(live.checksumsVerified, 2);
});

test("ordered diffs insert and remove at their indexes; a change moves the row", () => {
  const live = new LiveQueryImpl(stub(), "SELECT id, v FROM t ORDER BY v", undefined);
  feed(live, [
    msg({ type: "snapshot", seq: 5, columns: COLS, types: TYPES, keys: [1, 2], rows: [row(1, "a"), row(2, "b")], checksum: sum([[1, "a"], [2, "b"]]) }),
    msg({ type: "diff", seq: 6, changes: [change("add", 3, { row: row(3, "aa"), index: 1 }), change("change", 1, { row: row(1, "z"), index: 2 })], checksum: sum([[1, "z"], [2, "b"], [3, "aa"]]) }),
    msg({ type: "diff", seq: 7, changes: [change("remove", 2, { index: 1 })], checksum: sum([[1, "z"], [3, "aa"]]) }),
  ]);
  assert.deepEqual(live.rows, [{ id: 3, v: "aa" }, { id: 1, v: "z" }]);
  assert.equal(live.checksumMismatches, 0);
});

test("a diff that does not add up keeps the previous rows and resubscribes; bad diffs are protocol errors", () => {
  const live = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  const w = feed(live, [
    msg({ type: "snapshot", seq: 1, columns: COLS, types: TYPES, keys: [1], rows: [row(1, "a")], checksum: sum([[1, "a"]]) }),
    msg({ type: "diff", seq: 2, changes: [change("add", 2, { row: row(2, "b") })], checksum: "0000000000000000" }),
  ]);
  assert.equal(live.checksumMismatches, 1);
  assert.deepEqual(live.rows, [{ id: 1, v: "a" }], "the rows before the bad diff stay");
  assert.equal(live.status, "reconnecting");
  assert.match(w[0], /checksum mismatch at seq 2/);

  const l2 = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  const w2 = feed(l2, [
    msg({ type: "snapshot", seq: 1, columns: COLS, types: TYPES, keys: [1], rows: [row(1, "a")], checksum: sum([[1, "a"]]) }),
    msg({ type: "diff", seq: 2, changes: [change("remove", 9)], checksum: sum([[1, "a"]]) }),
  ]);
  assert.match(w2[0], /removes key 9, which is not held/);
  const l3 = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  const w3 = feed(l3, [
    msg({ type: "snapshot", seq: 3, columns: COLS, types: TYPES, keys: [1], rows: [row(1, "a")], checksum: sum([[1, "a"]]) }),
    msg({ type: "diff", seq: 3, changes: [], checksum: sum([[1, "a"]]) }),
  ]);
  assert.match(w3[0], /a diff at seq 3 after seq 3/);
});

test("a chunked snapshot is applied once its last chunk arrives, checksum verified over every chunk", () => {
  const live = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  let notified = 0;
  live.subscribe(() => notified++);
  const all = [[1, "a"], [2, "b"], [3, "c"], [4, "d"], [5, "e"]];
  const chunk = (rows, extra) => msg({ type: "snapshot", seq: 9, columns: COLS, types: TYPES, keys: rows.map(([id]) => id), rows: rows.map(([id, v]) => row(id, v)), ...extra });
  const w = feed(live, [chunk(all.slice(0, 2), { more: true }), chunk(all.slice(2, 3), { more: true })]);
  assert.deepEqual(w, []);
  assert.equal(live.seq, 0, "no seq before the last chunk");
  assert.deepEqual(live.rows, []);
  assert.equal(live.status, "loading");
  assert.equal(notified, 0);
  feed(live, [
    chunk(all.slice(3), { checksum: sum(all) }),
    msg({ type: "diff", seq: 10, changes: [change("remove", 2)], checksum: sum(all.filter(([id]) => id !== 2)) }),
  ]);
  assert.deepEqual(live.rows.map((r) => r.id), [1, 3, 4, 5]);
  assert.equal(live.seq, 10);
  assert.equal(live.checksumsVerified, 2);
  assert.equal(live.checksumMismatches, 0);
  assert.deepEqual(live.appliedSeqs, [9, 10]);
});

test("a chunked snapshot that does not add up resubscribes; a new snapshot's chunks replace an unfinished one", () => {
  const live = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  const chunk = (seq, rows, extra) => msg({ type: "snapshot", seq, columns: COLS, types: TYPES, keys: rows.map(([id]) => id), rows: rows.map(([id, v]) => row(id, v)), ...extra });
  const w = feed(live, [chunk(4, [[1, "a"]], { more: true }), chunk(4, [[2, "b"]], { checksum: sum([[1, "a"]]) })]);
  assert.equal(live.checksumMismatches, 1);
  assert.match(w[0], /checksum mismatch at seq 4/);
  assert.equal(live.status, "reconnecting");

  const l2 = new LiveQueryImpl(stub(), "SELECT id, v FROM t", undefined);
  feed(l2, [
    chunk(4, [[1, "a"]], { more: true }),
    // Cut short (a reset, say): the snapshot at seq 7 starts over.
    chunk(7, [[2, "b"]], { more: true }),
    chunk(7, [[3, "c"]], { checksum: sum([[2, "b"], [3, "c"]]), reset: true }),
  ]);
  assert.deepEqual(l2.rows.map((r) => r.id), [2, 3]);
  assert.equal(l2.seq, 7);
  assert.equal(l2.checksumMismatches, 0);
});
