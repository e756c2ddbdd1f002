// Resume paths beyond the plain reconnect: a client offline past the view's diff history gets
// a reset snapshot and ends equal; a policy change that reads a new claim ends subscriptions
// with rules_changed, which the SDK follows by subscribing again.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";
import { convergeTo } from "./helpers.mjs";

test("offline past the view's history: a reset snapshot replaces the rows, which end equal", { timeout: 60_000 }, async () => {
  const server = await new Server().start();
  let hold = null;
  const db = server.client({ testHooks: { beforeConnect: () => hold?.promise } });
  const writer = server.client();
  try {
    await writer.sql("CREATE TABLE c (id INTEGER PRIMARY KEY, v INTEGER)");
    await writer.mutate([{ op: "insert", table: "c", row: { id: 1, v: 0 } }]);
    const sql = "SELECT id, v FROM c ORDER BY id";
    const live = db.live(sql);
    await convergeTo(db, live, sql, undefined, { ordered: true, label: "before" });
    const kinds = [];
    const orig = live.onEvent.bind(live);
    live.onEvent = (m) => (kinds.push(m.get("reset") ? "reset" : m.get("type")), orig(m));

    let release;
    hold = { promise: new Promise((r) => (release = r)) };
    db.dropConnection();
    // 300 commits that each change the view: more than its 256-diff history.
    for (let i = 1; i <= 300; i++) await writer.mutate([{ op: "patch", table: "c", id: 1, set: { v: i } }, ...(i % 50 === 0 ? [{ op: "insert", table: "c", row: { id: 1 + i, v: -i } }] : [])]);
    assert.equal(live.status, "reconnecting");
    assert.equal(live.rows[0].v, 0, "the old rows stay visible while offline");
    hold = null;
    release();
    await convergeTo(db, live, sql, undefined, { ordered: true, label: "after" });
    assert.deepEqual(kinds.slice(0, 1), ["reset"], `resumed with a reset snapshot: ${kinds}`);
    assert.equal(live.rows[0].v, 300);
    assert.equal(live.checksumMismatches, 0);
  } finally {
    db.close();
    writer.close();
    await server.stop();
  }
});

test("a policy reading a new claim ends the subscription with rules_changed; the SDK subscribes again", { timeout: 60_000 }, async () => {
  const server = await new Server({ jwtSecret: "sdk-resume-secret" }).start();
  const admin = server.client();
  const db = server.client({ token: server.token("alice", { claims: { team: 7 } }) });
  try {
    await admin.sql("CREATE TABLE docs (id INTEGER PRIMARY KEY, owner TEXT, team INTEGER)");
    await admin.sql("CREATE POLICY own ON docs FOR SELECT USING (owner = auth.sub)");
    await admin.mutate([
      { op: "insert", table: "docs", row: { id: 1, owner: "alice", team: 1 } },
      { op: "insert", table: "docs", row: { id: 2, owner: "bob", team: 7 } },
      { op: "insert", table: "docs", row: { id: 3, owner: "carol", team: 2 } },
    ]);
    const sql = "SELECT id, owner FROM docs ORDER BY id";
    const live = db.live(sql);
    await until(() => live.status === "live" && live.rows.length === 1, "alice's own row");
    const errors = [];
    const orig = live.onEvent.bind(live);
    live.onEvent = (m) => (m.get("type") === "error" && errors.push(m.get("error").get("code")), orig(m));

    // Same claims read (auth.sub): a reset snapshot.
    await admin.sql("CREATE POLICY own2 ON docs FOR SELECT USING (owner = auth.sub OR owner = 'carol')");
    await until(() => live.rows.length === 2, "the reset under the second policy");
    // A new claim (auth.team): rules_changed, then the SDK's own resubscribe.
    await admin.sql("CREATE POLICY team ON docs FOR SELECT USING (team = auth.team)");
    await until(() => live.status === "live" && live.rows.map((r) => r.id).join() === "1,2,3", "rows under the team policy");
    assert.deepEqual(errors, ["rules_changed"]);
    assert.equal(live.error, null);
    const q = await db.query(sql);
    assert.deepEqual(live.rows, q.rows);
  } finally {
    db.close();
    admin.close();
    await server.stop();
  }
});
