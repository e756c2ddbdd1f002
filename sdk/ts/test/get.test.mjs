// Point reads: client.get by primary key (a missing row is null, not an error) and
// client.find through an indexed column, paged, and client.getMany (many keys, one reply),
// over both encodings.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server } from "./server.mjs";

for (const encoding of ["msgpack", "json"]) {
  test(`get and find read rows by key and by index (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    const db = server.client({ encoding, heartbeatMs: 100 });
    try {
      await db.sql("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL, team TEXT, score REAL); CREATE INDEX users_team ON users (team)");
      const m = await db.mutate(
        [1, 2, 3, 4, 5].map((id) => ({ op: "insert", table: "users", row: { id, email: `u${id}@x`, team: id % 2 ? "odd" : "even", score: id + 0.5 } })),
        { durability: "disk" },
      );
      const got = await db.get("users", 3);
      assert.deepEqual(got.row, { id: 3, email: "u3@x", team: "odd", score: 3.5 });
      assert.equal(got.version, m.results[2].version);
      assert.ok(got.seq >= m.seq);
      const missing = await db.get("users", 99);
      assert.equal(missing.row, null);
      assert.equal(missing.version, null);
      await assert.rejects(db.get("nope", 1), (e) => e.code === "not_found");
      await assert.rejects(db.get("users", "three"), (e) => e.code === "schema");

      const first = await db.find("users", { column: "team" }, "odd", { limit: 2 });
      assert.deepEqual(first.rows.map((r) => r.row.id), [1, 3]);
      assert.equal(first.next, 3);
      const rest = await db.find("users", { index: "users_team" }, "odd", { limit: 2, after: first.next });
      assert.deepEqual(rest.rows.map((r) => r.row.id), [5]);
      assert.equal(rest.next, null);
      await assert.rejects(db.find("users", { column: "email" }, "u1@x"), (e) => e.code === "bad_request" && /CREATE INDEX/.test(e.message));

      // Many keys in one request: an entry per key in order, null for a missing one.
      const many = await db.getMany("users", [4, 99, 1, 4]);
      assert.deepEqual(many.rows.map((r) => r?.row.id ?? null), [4, null, 1, 4]);
      assert.deepEqual(many.rows[0].row, { id: 4, email: "u4@x", team: "even", score: 4.5 });
      assert.equal(many.rows[2].version, m.results[0].version);
      assert.ok(many.seq >= m.seq);
      assert.deepEqual((await db.getMany("users", [])).rows, []);
      await assert.rejects(
        db.getMany("users", Array.from({ length: 1001 }, (_, i) => i)),
        (e) => e.code === "limit" && /get_keys_max/.test(e.message),
      );
      await assert.rejects(db.getMany("users", [1, "two"]), (e) => e.code === "schema");
    } finally {
      db.close();
      await server.stop();
    }
  });
}
