// `coalesceMs` is passed through: a live query over a hot row written ten times in one window
// gets one folded diff (its rows still equal the one-shot query), and a coalescing watch still
// gets every record once, in order.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";

for (const encoding of ["msgpack", "json"]) {
  test(`coalesceMs folds a hot row's commits and batches watch records (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    const db = server.client({ encoding });
    try {
      await db.sql("CREATE TABLE items (id INTEGER PRIMARY KEY, n INTEGER)");
      await db.mutate([{ op: "insert", table: "items", row: { id: 1, n: 0 } }]);
      const plain = db.live("SELECT * FROM items");
      const folded = db.live("SELECT * FROM items", undefined, { coalesceMs: 1500 });
      await until(() => plain.status === "live" && folded.status === "live");
      const before = folded.appliedSeqs.length;
      let last = 0;
      const writes = [];
      for (let n = 1; n <= 10; n++) writes.push(db.mutate([{ op: "upsert", table: "items", row: { id: 1, n } }]));
      for (const w of await Promise.all(writes)) last = Math.max(last, w.seq);
      await until(() => plain.seq === last && folded.seq === last);
      assert.deepEqual(folded.rows, [{ id: 1, n: 10 }]);
      assert.deepEqual(folded.rows, plain.rows);
      assert.equal(folded.appliedSeqs.length - before, 1, "one folded diff for the ten commits");
      assert.equal(folded.checksumMismatches, 0);

      await db.http("PUT", "/v1/topics/chat", {});
      const w = db.watch("chat", { coalesceMs: 100 });
      await until(() => w.status === "live");
      for (let i = 0; i < 20; i++) await db.append("chat", [{ data: i }]);
      await until(() => w.records.length === 20);
      assert.deepEqual(w.records.map((r) => r.data), [...Array(20).keys()]);
    } finally {
      db.close();
      await server.stop();
    }
  });
}
