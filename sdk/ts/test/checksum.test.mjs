// 5. Checksums: every column type, computed and aggregate columns, both encodings, verified
// against the server's; a diff corrupted on purpose is detected and the query resubscribes.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";
import { convergeTo } from "./helpers.mjs";

const ROWS = [
  { id: 1, i: 0, r: 1.0, b: true, t: "plain", bl: "AAEC/w==", j: { b: 1, 2: "two", a: [1.0, 2.5, 1e-7, 1e21, -3] }, ts: 1732400000000000 },
  { id: 2, i: -9007199254740991, r: -0.5, b: false, t: "ünïcödé 🙂 \"quoted\"\n", bl: "", j: [null, true, "x\u0001y", { z: {} }], ts: 0 },
  { id: 3, i: null, r: null, b: null, t: null, bl: null, j: null, ts: null },
  { id: 4, i: 42, r: 123456789.125, b: true, t: "", bl: "/w==", j: "just a string", ts: -1 },
  { id: 5, i: 7, r: 3.0, b: false, t: "seven", bl: "c2V2ZW4=", j: 1.5, ts: 7 },
];

const QUERIES = [
  { label: "every type", sql: "SELECT * FROM vals", ordered: false },
  { label: "ordered window", sql: "SELECT id, t, r, j FROM vals ORDER BY id DESC LIMIT 3", ordered: true },
  { label: "computed", sql: "SELECT id, r * 2 AS r2, i + 1 AS i1, t || '!' AS t2, id / 2.0 AS half FROM vals WHERE id < 100", ordered: false },
  { label: "aggregates", sql: "SELECT b, COUNT(*) AS n, SUM(i) AS si, AVG(r) AS ar, MIN(ts) AS mts, MAX(t) AS mt FROM vals GROUP BY b", ordered: false },
];

for (const encoding of ["msgpack", "json"]) {
  test(`checksums of every column type match the server's (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    const db = server.client({ encoding });
    try {
      await db.sql("CREATE TABLE vals (id INTEGER PRIMARY KEY, i INTEGER, r REAL, b BOOLEAN, t TEXT, bl BLOB, j JSON, ts TIMESTAMP)");
      await db.mutate(ROWS.map((row) => ({ op: "insert", table: "vals", row })));
      const lives = QUERIES.map((q) => ({ ...q, live: db.live(q.sql) }));
      for (const q of lives) await convergeTo(db, q.live, q.sql, undefined, { ordered: q.ordered, label: q.label });
      for (const q of lives) assert.ok(q.live.types && q.live.types.length === q.live.columns.length, `${q.label}: the snapshot carries types`);

      // Changes of every kind; big integers as bigint.
      await db.mutate([
        { op: "patch", table: "vals", id: 1, set: { j: { x: [0.1, 100000000000000000000.0, 1e-5], "10": false } } },
        { op: "patch", table: "vals", id: 2, set: { i: 4611686018427387904n, r: 1e300 } },
        { op: "delete", table: "vals", id: 3 },
        { op: "insert", table: "vals", row: { id: 6, i: 1, r: 2.25, b: true, t: "six", bl: "Ng==", j: { "": [] }, ts: 6 } },
      ]);
      await db.mutate([{ op: "patch", table: "vals", id: 5, set: { t: "z-last", b: true, ts: 99 } }]);
      await db.mutate([{ op: "upsert", table: "vals", row: { id: 4, i: 4, r: 0.1, b: false, t: "four", bl: null, j: [1, [2, [3.5]]], ts: 4 } }]);
      for (const q of lives) {
        await convergeTo(db, q.live, q.sql, undefined, { ordered: q.ordered, label: q.label });
        assert.equal(q.live.checksumMismatches, 0, `${q.label}: no mismatch`);
        assert.ok(q.live.checksumsVerified >= 2, `${q.label}: verified ${q.live.checksumsVerified} events`);
      }
      const big = lives[0].live.rows.find((r) => r.id === 2);
      assert.equal(big.i, 4611686018427387904n, "an i64 beyond 2^53 arrives exactly, as a bigint");
    } finally {
      db.close();
      await server.stop();
    }
  });

  test(`a corrupted diff is detected and the query resubscribes, ending equal (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    let corrupt = false;
    const db = server.client({
      encoding,
      testHooks: {
        beforeApply(m) {
          if (!corrupt || m.get("type") !== "diff") return;
          corrupt = false;
          const row = m.get("changes").find((c) => c.get("row"))?.get("row");
          const i = row.keys.indexOf("body");
          row.values[i] = "corrupted on the way";
        },
      },
    });
    const warnings = [];
    const warn = console.warn;
    console.warn = (...a) => warnings.push(a.join(" "));
    try {
      await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, body TEXT)");
      await db.mutate([{ op: "insert", table: "msgs", row: { id: 1, body: "one" } }]);
      const sql = "SELECT * FROM msgs ORDER BY id";
      const live = db.live(sql);
      await convergeTo(db, live, sql, undefined, { ordered: true, label: "before" });
      const statuses = [];
      live.subscribe(() => statuses.push(live.status));
      corrupt = true;
      await db.mutate([{ op: "insert", table: "msgs", row: { id: 2, body: "two" } }]);
      await until(() => live.checksumMismatches === 1, "the mismatch to be detected");
      await convergeTo(db, live, sql, undefined, { ordered: true, label: "after the resubscribe" });
      assert.ok(!live.rows.some((r) => r.body === "corrupted on the way"), "the corrupted row is gone");
      assert.ok(statuses.includes("reconnecting"), `status went through reconnecting: ${statuses}`);
      assert.equal(live.status, "live");
      assert.equal(warnings.filter((w) => /checksum mismatch/.test(w)).length, 1, `reported once: ${warnings}`);
      // It keeps following changes afterwards.
      await db.mutate([{ op: "insert", table: "msgs", row: { id: 3, body: "three" } }]);
      await convergeTo(db, live, sql, undefined, { ordered: true, label: "later" });
      assert.equal(live.checksumMismatches, 1);
    } finally {
      console.warn = warn;
      db.close();
      await server.stop();
    }
  });
}

// A REAL like 271/3 must arrive exact (90.33333333333333, not one ULP off): the server parses
// JSON floats correctly rounded (serde_json's float_roundtrip) when a write arrives as JSON and
// when a live event is re-encoded as MessagePack, so the checksum of what the client holds
// matches the stored value.
for (const encoding of ["msgpack", "json"]) {
  test(`REALs that are not short decimals arrive exact and verify (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    const db = server.client({ encoding });
    const warn = console.warn;
    console.warn = () => {};
    try {
      await db.sql("CREATE TABLE r (id INTEGER PRIMARY KEY, x REAL)");
      await db.mutate(Array.from({ length: 400 }, (_, i) => ({ op: "insert", table: "r", row: { id: i, x: i / 3 } })));
      const live = db.live("SELECT id, x FROM r");
      await until(() => live.status === "live" || live.status === "error", "the snapshot");
      await db.mutate([{ op: "patch", table: "r", id: 1, set: { x: 1000 / 3 } }]);
      await until(() => live.status !== "live" || live.rows.find((r) => r.id === 1).x === 1000 / 3, "the diff");
      assert.equal(live.checksumMismatches, 0);
      for (const r of live.rows) assert.equal(r.x, r.id === 1 ? 1000 / 3 : r.id / 3, `row ${r.id} arrived exact`);
    } finally {
      console.warn = warn;
      db.close();
      await server.stop();
    }
  });
}
