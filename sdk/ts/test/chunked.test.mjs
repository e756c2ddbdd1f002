// A snapshot too large for one message (docs/protocol.md, "Large snapshots") arrives in
// chunks from a real server; the SDK assembles them, verifies the checksum once, then follows
// diffs — equal to the one-shot query, in both encodings.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server } from "./server.mjs";
import { convergeTo } from "./helpers.mjs";

const ROWS = 20_000;

for (const encoding of ["msgpack", "json"]) {
  test(`a chunked snapshot is assembled and verified, then diffs follow (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    const db = server.client({ encoding });
    try {
      await db.sql("CREATE TABLE big (id INTEGER PRIMARY KEY, name TEXT, score REAL)");
      for (let from = 0; from < ROWS; from += 1_000) {
        const ops = [];
        for (let id = from; id < from + 1_000; id++) ops.push({ op: "insert", table: "big", row: { id, name: `row "${id}" ✓`, score: id / 7 } });
        await db.mutate(ops);
      }
      const sql = "SELECT * FROM big";
      const live = db.live(sql);
      let events = 0;
      live.subscribe(() => events++);
      await convergeTo(db, live, sql, undefined, { ordered: false, label: "snapshot", ms: 30_000 });
      assert.equal(live.rows.length, ROWS);
      assert.equal(live.checksumMismatches, 0);
      assert.equal(live.checksumsVerified, 1, "one checksum for the whole snapshot");
      assert.equal(events, 1, "listeners hear of the snapshot once, when it is whole");
      const { seq } = await db.mutate([{ op: "delete", table: "big", id: 7 }, { op: "insert", table: "big", row: { id: ROWS, name: "new", score: 0.5 } }]);
      const q = await convergeTo(db, live, sql, undefined, { ordered: false, label: "diff" });
      assert.ok(q.seq >= seq);
      assert.equal(live.rows.length, ROWS);
      assert.equal(live.checksumMismatches, 0);
    } finally {
      db.close();
      await server.stop();
    }
  });
}
