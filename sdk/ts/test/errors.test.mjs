// 4. Bad input surfaces as typed errors (SluiceError with the server's code, status, details).

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";
import { SluiceError } from "../dist/index.js";

async function rejectsWith(promise, code, check = () => {}) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof SluiceError, `expected a SluiceError, got ${e}`);
    assert.equal(e.code, code, `expected code ${code}, got ${e.code}: ${e.message}`);
    assert.equal(typeof e.message, "string");
    assert.equal(typeof e.details, "object");
    check(e);
    return true;
  });
}

for (const encoding of ["msgpack", "json"]) {
  test(`bad input surfaces as typed errors (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server({ jwtSecret: "sdk-errors-secret" }).start();
    const db = server.client({ encoding });
    const client = server.client({ encoding, token: server.token("alice") });
    try {
      await db.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");

      // Bad SQL, over the WebSocket and over HTTP.
      await rejectsWith(db.query("SELEC nope"), "bad_request");
      await rejectsWith(db.sql("SELEC nope"), "bad_request", (e) => assert.equal(e.status, 400));
      await rejectsWith(db.query("SELECT * FROM t UNION SELECT * FROM t"), "unsupported", (e) => assert.match(e.message, /UNION/));

      // Unknown things.
      await rejectsWith(db.query("SELECT * FROM nope"), "not_found");
      await rejectsWith(db.mutate([{ op: "insert", table: "nope", row: { id: 1 } }]), "not_found", (e) => assert.equal(e.details.op, 0));
      await rejectsWith(db.call("no_such_function", {}), "not_found");
      await rejectsWith(db.append("no_such_topic", [{ data: 1 }]), "not_found");

      // Data errors carry the failing op.
      await rejectsWith(
        db.mutate([{ op: "insert", table: "t", row: { id: 1 } }, { op: "insert", table: "t", row: { id: 1 } }]),
        "already_exists",
        (e) => assert.equal(e.details.op, 1),
      );
      await rejectsWith(db.mutate([{ op: "insert", table: "t", row: { id: 2, nope: 1 } }]), "schema");

      // A client token: forbidden on admin endpoints and where no policy allows.
      await rejectsWith(client.sql("CREATE TABLE u (id INTEGER PRIMARY KEY)"), "forbidden", (e) => assert.equal(e.status, 403));
      await rejectsWith(client.mutate([{ op: "insert", table: "t", row: { id: 5 } }]), "forbidden", (e) => {
        assert.equal(e.details.table, "t");
        assert.equal(e.details.command, "insert");
      });

      // A bad token: the socket cannot open; requests fail with unauthorized, not a timeout.
      const bad = server.client({ encoding, token: "not-a-token" });
      await rejectsWith(bad.query("SELECT * FROM t"), "unauthorized", (e) => assert.equal(e.status, 401));
      await rejectsWith(bad.sql("CREATE TABLE x (id INTEGER PRIMARY KEY)"), "unauthorized");
      bad.close();

      // A live query that does not plan: status "error" with the code.
      const live = db.live("SELECT * FROM nope");
      await until(() => live.status === "error", "the live query to fail");
      assert.ok(live.error instanceof SluiceError);
      assert.equal(live.error.code, "not_found");
      const unsupported = db.live("SELECT * FROM t UNION SELECT * FROM t");
      await until(() => unsupported.status === "error", "the unsupported live query to fail");
      assert.equal(unsupported.error.code, "unsupported");

      // A live query whose table is dropped ends with the error.
      const ok = db.live("SELECT * FROM t");
      await until(() => ok.status === "live", "the live query to start");
      await db.sql("DROP TABLE t");
      await until(() => ok.status === "error", "the live query to end after DROP TABLE");
      assert.equal(ok.error.code, "not_found");

      // The connection stays usable after every error.
      const r = await db.query("SELECT * FROM groups_that_do_not_exist").catch((e) => e);
      assert.equal(r.code, "not_found");
      await db.sql("CREATE TABLE t2 (id INTEGER PRIMARY KEY)");
      assert.deepEqual((await db.query("SELECT * FROM t2")).rows, []);

      // A closed client refuses with disconnected.
      const closing = server.client({ encoding });
      closing.close();
      await rejectsWith(closing.query("SELECT * FROM t2"), "disconnected");
    } finally {
      db.close();
      client.close();
      await server.stop();
    }
  });
}

for (const encoding of ["msgpack", "json"]) {
  test(`requests the server cannot take fail with typed errors instead of hanging (${encoding})`, { timeout: 30_000 }, async () => {
    const server = await new Server({ extraArgs: ["--max-body-bytes", "4096"] }).start();
    const db = server.client({ encoding });
    try {
      await db.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, r REAL)");
      // A frame over --max-body-bytes is refused before its id is read: still this request's error.
      await rejectsWith(db.mutate([{ op: "insert", table: "t", row: { id: 1, v: "x".repeat(6000) } }]), "limit", (e) => assert.match(e.message, /max-body-bytes/));
      // Values that cannot be sent are refused locally.
      await rejectsWith(db.mutate([{ op: "insert", table: "t", row: { id: 2, r: NaN } }]), "bad_request");
      let deep = "v";
      for (let i = 0; i < 130; i++) deep = { d: deep };
      await rejectsWith(db.query("SELECT * FROM t WHERE v = $1", [deep]), "bad_request");
      // The connection is still usable.
      await db.mutate([{ op: "insert", table: "t", row: { id: 3, v: "ok" } }]);
      assert.deepEqual((await db.query("SELECT id, v FROM t")).rows, [{ id: 3, v: "ok" }]);
    } finally {
      db.close();
      await server.stop();
    }
  });
}

test("closing the client ends its live queries and watches with disconnected", { timeout: 30_000 }, async () => {
  const server = await new Server().start();
  const db = server.client();
  try {
    await db.sql("CREATE TABLE t (id INTEGER PRIMARY KEY)");
    await server.http("PUT", "/v1/topics/tt", {});
    const live = db.live("SELECT * FROM t");
    const watch = db.watch("tt");
    await until(() => live.status === "live" && watch.status === "live", "live and watching");
    db.close();
    assert.equal(db.status, "closed");
    assert.equal(live.status, "error");
    assert.equal(live.error.code, "disconnected");
    assert.equal(watch.status, "error");
    assert.equal(watch.error.code, "disconnected");
    const late = db.live("SELECT * FROM t");
    assert.equal(late.status, "error");
    assert.equal(late.error.code, "disconnected");
  } finally {
    db.close();
    await server.stop();
  }
});
