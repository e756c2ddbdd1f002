// 2. kill -9 and restart under a subscribed client: it resumes, no duplicate, no gap.
// Also: a dropped connection (server still up) resumes with exactly the missed diffs.
// 3. Token refresh: a token function is called again at reconnect, and its new token is used.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";
import { convergeTo } from "./helpers.mjs";

const SQL = "SELECT id, body, n FROM msgs ORDER BY id";

/** Records every event a live query applies: [kind, seq]. */
function recordEvents(live) {
  const events = [];
  const orig = live.onEvent.bind(live);
  live.onEvent = (m) => {
    const type = m.get("type");
    const before = live.appliedSeqs.length;
    orig(m);
    if (live.appliedSeqs.length > before) events.push([type === "snapshot" ? (m.get("reset") ? "reset" : "snapshot") : "diff", m.get("seq")]);
  };
  return events;
}

function assertNoDuplicateNoGap(events, label) {
  for (let i = 1; i < events.length; i++) {
    const [kind, seq] = events[i];
    const prev = events[i - 1][1];
    if (kind === "diff") assert.ok(seq > prev, `${label}: diff at seq ${seq} after seq ${prev} (${JSON.stringify(events)})`);
    else assert.ok(seq >= prev, `${label}: ${kind} at seq ${seq} went back from ${prev}`);
  }
}

for (const encoding of ["msgpack", "json"]) {
  test(`a killed and restarted server: the client keeps its rows while reconnecting, resumes, ends equal (${encoding})`, { timeout: 60_000 }, async () => {
    const server = await new Server({ durability: "disk" }).start();
    const db = server.client({ encoding });
    const statuses = [];
    db.onStatus((s) => statuses.push(s));
    try {
      await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, body TEXT, n INTEGER)");
      await server.http("PUT", "/v1/topics/chat", {});
      const live = db.live(SQL);
      const events = recordEvents(live);
      const watch = db.watch("chat", { from: 0 });
      const offsets = [];
      watch.subscribe((r) => r && offsets.push(r.offset));
      const liveStatuses = [];
      live.subscribe(() => liveStatuses.at(-1) !== live.status && liveStatuses.push(live.status));

      for (let i = 1; i <= 5; i++) {
        await db.mutate([{ op: "insert", table: "msgs", row: { id: i, body: `m${i}`, n: i } }]);
        await db.append("chat", [{ tags: ["t"], data: { i } }]);
      }
      await convergeTo(db, live, SQL, undefined, { ordered: true, label: "before the kill" });
      await until(() => offsets.length === 5, "5 records before the kill");
      const rowsBefore = live.rows;

      await server.kill9();
      await until(() => live.status === "reconnecting" && db.status === "reconnecting", "status reconnecting");
      assert.deepEqual(live.rows, rowsBefore, "rows stay visible while reconnecting");
      assert.equal(watch.status, "reconnecting");

      await server.start(); // same data dir, same port
      // Writes from another client right after the restart, racing the resume.
      const other = server.client({ encoding });
      for (let i = 6; i <= 10; i++) {
        await other.mutate([{ op: "insert", table: "msgs", row: { id: i, body: `m${i}`, n: i } }]);
        await other.append("chat", [{ tags: ["t"], data: { i } }]);
      }
      await other.mutate([{ op: "patch", table: "msgs", id: 2, set: { body: "edited" } }, { op: "delete", table: "msgs", id: 3 }]);
      other.close();

      await until(() => db.status === "open", "the client reconnected");
      await convergeTo(db, live, SQL, undefined, { ordered: true, label: "after the restart" });
      await until(() => offsets.length >= 10, "10 records after the restart");
      assert.deepEqual(offsets, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], "every offset exactly once, in order");
      assert.equal(watch.next, 10);
      assertNoDuplicateNoGap(events, "after the restart");
      assert.ok(liveStatuses.includes("reconnecting") && liveStatuses.at(-1) === "live", `live statuses ${liveStatuses}`);
      assert.ok(statuses.includes("reconnecting"), `client statuses ${statuses}`);
      assert.equal(live.checksumMismatches, 0);

      // A dropped connection with the server up resumes with exactly the missed diffs: no reset.
      const snapshotsBefore = events.filter(([k]) => k !== "diff").length;
      db.dropConnection();
      const w = server.client({ encoding });
      await w.mutate([{ op: "insert", table: "msgs", row: { id: 11, body: "m11", n: 11 } }]);
      await w.mutate([{ op: "delete", table: "msgs", id: 1 }]);
      await w.append("chat", [{ data: 11 }, { data: 12 }]);
      w.close();
      await until(() => db.status === "open", "the client reconnected after the drop");
      await convergeTo(db, live, SQL, undefined, { ordered: true, label: "after the drop" });
      await until(() => offsets.length >= 12, "12 records after the drop");
      assert.deepEqual(offsets, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
      assertNoDuplicateNoGap(events, "after the drop");
      assert.equal(events.filter(([k]) => k !== "diff").length, snapshotsBefore, `resumed with diffs, no snapshot: ${JSON.stringify(events)}`);
      live.close();
      watch.close();
    } finally {
      db.close();
      await server.stop();
    }
  });
}

test("token refresh: the token function is called again at reconnect and its new token is used", { timeout: 60_000 }, async () => {
  const server = await new Server({ jwtSecret: "sdk-test-secret", durability: "disk" }).start();
  const admin = server.client();
  let calls = 0;
  const db = server.client({
    token: async () => {
      calls++;
      // The first token is user1's, every later one (one per reconnect attempt) user2's.
      return server.token(calls === 1 ? "user1" : "user2", { ttl: "2s" });
    },
  });
  try {
    await admin.sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT, body TEXT)");
    await admin.sql("CREATE POLICY own ON notes FOR SELECT USING (owner = auth.sub)");
    await admin.mutate([
      { op: "insert", table: "notes", row: { id: 1, owner: "user1", body: "for the first token" } },
      { op: "insert", table: "notes", row: { id: 2, owner: "user2", body: "for the second token" } },
    ]);
    const live = db.live("SELECT id, body FROM notes ORDER BY id");
    await until(() => live.status === "live" && live.rows.length === 1, "user1's row");
    assert.equal(live.rows[0].id, 1);
    assert.equal(calls, 1);

    await server.kill9();
    await server.start();
    await until(() => live.status === "live" && live.rows[0]?.id === 2, "the live query re-read under the new token", 20_000);
    assert.ok(calls >= 2, `token function called ${calls} times`);
    const q = await db.query("SELECT id FROM notes");
    assert.deepEqual(q.rows, [{ id: 2 }], "requests go out under the new token");
    live.close();
  } finally {
    db.close();
    admin.close();
    await server.stop();
  }
});

test("kill -9 under continuous writes: the live query ends equal, the watch sees every kept offset once", { timeout: 60_000 }, async () => {
  const server = await new Server({ durability: "disk" }).start();
  const db = server.client();
  const writer = server.client({ requestTimeoutMs: 20_000 });
  try {
    await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, body TEXT, n INTEGER)");
    await server.http("PUT", "/v1/topics/chat", {});
    const live = db.live(SQL);
    const events = recordEvents(live);
    const watch = db.watch("chat", { from: 0 });
    const offsets = [];
    watch.subscribe((r) => r && offsets.push(r.offset));
    await until(() => live.status === "live" && watch.status === "live", "subscribed");

    let stop = false;
    let written = 0;
    const loop = (async () => {
      for (let id = 1; !stop; id++) {
        try {
          await writer.mutate([{ op: "insert", table: "msgs", row: { id, body: `m${id}`, n: id % 7 } }, ...(id > 3 ? [{ op: "delete", table: "msgs", id: id - 3 }] : [])]);
          await writer.append("chat", [{ data: id }]);
          written++;
        } catch (e) {
          if (e.code !== "disconnected" && e.code !== "not_found" && e.code !== "already_exists") throw e;
        }
      }
    })();
    await until(() => written >= 20, "20 writes before the kill");
    await server.kill9();
    await until(() => live.status === "reconnecting", "reconnecting");
    await server.start();
    const after = written;
    await until(() => written >= after + 20, "20 writes after the restart");
    stop = true;
    await loop;

    await convergeTo(db, live, SQL, undefined, { ordered: true, label: "after continuous writes" });
    const info = await server.http("GET", "/v1/topics/chat");
    await until(() => watch.next === info.next, `the watch to reach offset ${info.next}`);
    assert.deepEqual(offsets, Array.from({ length: info.next }, (_, i) => i), "every kept offset exactly once, in order");
    assertNoDuplicateNoGap(events, "continuous writes");
    assert.equal(live.checksumMismatches, 0);
  } finally {
    db.close();
    writer.close();
    await server.stop();
  }
});
