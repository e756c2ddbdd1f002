// Every request kind over both encodings: query (positional and named params), mutate with
// durability, call, sql (several statements as one transaction; the failing one named),
// append and watch with a tag filter, http for other endpoints.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";

const MODULE = `
export function add(tx, { id, body }) { tx.insert("msgs", { id, room: "fn", body }); return { added: id, half: 0.5 }; }
export function boom(tx) { throw new Error("boom: on purpose"); }
`;

for (const encoding of ["msgpack", "json"]) {
  test(`queries, writes, calls, SQL and topics round-trip (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server().start();
    const db = server.client({ encoding, heartbeatMs: 100 });
    try {
      const ddl = await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, room TEXT NOT NULL, body TEXT, score REAL)");
      assert.equal(ddl.changed, true);
      assert.equal(ddl.results[0].kind, "ddl");

      const m = await db.mutate(
        [
          { op: "insert", table: "msgs", row: { id: 1, room: "a", body: "one", score: 1.5 } },
          { op: "insert", table: "msgs", row: { id: 2, room: "b", body: "two", score: 2 } },
        ],
        { durability: "fsync" },
      );
      assert.equal(m.results.length, 2);
      assert.equal(m.results[0].version, m.seq);

      const q = await db.query("SELECT id, body, score FROM msgs WHERE room = $1", ["a"]);
      assert.deepEqual(q.rows, [{ id: 1, body: "one", score: 1.5 }]);
      assert.deepEqual(q.columns, ["id", "body", "score"]);
      assert.deepEqual(q.types, ["integer", "text", "real"]);
      const named = await db.query("SELECT id FROM msgs WHERE room = :room", { room: "b" });
      assert.deepEqual(named.rows, [{ id: 2 }]);

      // SQL: several statements, one transaction; a later one sees the earlier ones.
      const r = await db.sql("INSERT INTO msgs (id, room, body) VALUES ($1, 'c', 'three'); UPDATE msgs SET body = body || '!' WHERE room = 'c'; SELECT id, body FROM msgs WHERE room = 'c'", [3]);
      assert.deepEqual(
        r.results.map((x) => x.kind),
        ["insert", "update", "select"],
      );
      assert.deepEqual(r.results[2].rows, [{ id: 3, body: "three!" }]);
      await assert.rejects(db.sql("INSERT INTO msgs (id, room) VALUES (4, 'd'); INSERT INTO msgs (id, room) VALUES (1, 'dup')"), (e) => {
        assert.equal(e.code, "already_exists");
        assert.equal(e.details.statement, 1, "the failing statement is named");
        return true;
      });
      assert.deepEqual((await db.query("SELECT id FROM msgs WHERE id = 4")).rows, [], "all or nothing");
      const select = await db.sql("SELECT 1 + 2 AS three");
      assert.deepEqual(select.results[0].rows, [{ three: 3 }]);

      // Server functions.
      const put = await fetch(`${server.url}/v1/functions`, { method: "PUT", headers: { authorization: "Bearer admin-token-for-sdk-tests" }, body: MODULE });
      assert.equal(put.status, 200, await put.text());
      const c = await db.call("add", { id: 10, body: "from a function" });
      assert.deepEqual(c.result, { added: 10, half: 0.5 });
      assert.ok(c.seq > 0);
      await assert.rejects(db.call("boom"), (e) => e.code === "function_error" && /on purpose/.test(e.message));

      // Topics: append, watch with a tag filter.
      await db.http("PUT", "/v1/topics/events", {});
      const watch = db.watch("events", { tags: ["room:a*"] });
      await until(() => watch.status === "live", "the watch");
      const a = await db.append("events", [{ tags: ["room:a1"], data: { n: 1 } }, { tags: ["room:b"], data: { n: 2 } }, { data: [1.5, "x"] }, { tags: ["room:a2"] }]);
      assert.equal(a.last - a.first, 3);
      await until(() => watch.records.length === 2, "the two matching records");
      assert.deepEqual(
        watch.records.map((x) => [x.offset, x.tags, x.data]),
        [
          [a.first, ["room:a1"], { n: 1 }],
          [a.first + 3, ["room:a2"], null],
        ],
      );
      assert.equal(watch.next, a.first + 4);
      const second = db.watch("events");
      assert.equal(second.status, "error");
      assert.equal(second.error.code, "already_exists");
      watch.close();

      // BLOBs: a Uint8Array goes as base64 text in both encodings; it comes back as base64.
      await db.sql("CREATE TABLE files (id INTEGER PRIMARY KEY, data BLOB)");
      await db.mutate([{ op: "insert", table: "files", row: { id: 1, data: new Uint8Array([0, 1, 2, 255]) } }]);
      assert.deepEqual((await db.query("SELECT data FROM files")).rows, [{ data: "AAEC/w==" }]);

      // http(): any other endpoint.
      const tables = await db.http("GET", "/v1/tables");
      assert.deepEqual(tables.tables.map((t) => t.name).sort(), ["files", "msgs"]);
      await assert.rejects(db.http("GET", "/v1/tables/nope/rows/1"), (e) => e.code === "not_found" && e.status === 404);
      assert.equal(db.status, "open", "the 100 ms heartbeat kept the connection");
    } finally {
      db.close();
      await server.stop();
    }
  });
}
