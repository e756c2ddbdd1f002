// 6. The store behind useLiveQuery/useTopic: keeps the previous rows while new params load;
// a stable snapshot object between changes (what useSyncExternalStore needs).

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, until } from "./server.mjs";
import { LiveQueryStore, TopicStore } from "../dist/index.js";

test("useLiveQuery's store keeps the previous rows while new params load", { timeout: 60_000 }, async () => {
  const server = await new Server().start();
  const db = server.client();
  try {
    await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, room TEXT, body TEXT)");
    await db.mutate([
      { op: "insert", table: "msgs", row: { id: 1, room: "a", body: "a1" } },
      { op: "insert", table: "msgs", row: { id: 2, room: "a", body: "a2" } },
      { op: "insert", table: "msgs", row: { id: 3, room: "b", body: "b1" } },
    ]);
    const store = new LiveQueryStore(db);
    const seen = [];
    store.subscribe(() => {
      const s = store.getSnapshot();
      seen.push({ status: s.status, ids: s.rows.map((r) => r.id) });
    });
    assert.deepEqual(store.getSnapshot(), { rows: [], status: "loading", error: null });

    const sql = "SELECT id, body FROM msgs WHERE room = $1 ORDER BY id";
    store.setQuery(sql, ["a"]);
    await until(() => store.getSnapshot().status === "live", "room a");
    assert.deepEqual(store.getSnapshot().rows.map((r) => r.id), [1, 2]);
    const snap = store.getSnapshot();
    assert.equal(store.getSnapshot(), snap, "the same snapshot object while nothing changes");
    store.setQuery(sql, ["a"]); // same query: nothing happens
    assert.equal(store.getSnapshot(), snap);

    // New params: the old rows stay, status "loading", until the new snapshot.
    seen.length = 0;
    store.setQuery(sql, ["b"]);
    assert.deepEqual(store.getSnapshot().rows.map((r) => r.id), [1, 2], "previous rows stay while loading");
    assert.equal(store.getSnapshot().status, "loading");
    await until(() => store.getSnapshot().status === "live", "room b");
    assert.deepEqual(store.getSnapshot().rows.map((r) => r.id), [3]);
    for (const s of seen.slice(0, -1)) assert.deepEqual(s, { status: "loading", ids: [1, 2] }, `no empty frame in between: ${JSON.stringify(seen)}`);
    assert.ok(!seen.some((s) => s.ids.length === 0), `never showed an empty list: ${JSON.stringify(seen)}`);

    // Live changes flow through the store.
    await db.mutate([{ op: "insert", table: "msgs", row: { id: 4, room: "b", body: "b2" } }]);
    await until(() => store.getSnapshot().rows.length === 2, "the new row");

    // A query that fails shows status "error" with the error.
    store.setQuery("SELECT * FROM nope");
    await until(() => store.getSnapshot().status === "error", "the error");
    assert.equal(store.getSnapshot().error.code, "not_found");

    // Closing (unmount) and setting a query again (StrictMode's remount) works.
    store.close();
    store.setQuery(sql, ["a"]);
    await until(() => store.getSnapshot().status === "live" && store.getSnapshot().rows.length === 2, "room a again");
    store.close();

    // The topic store.
    await server.http("PUT", "/v1/topics/presence", {});
    const topic = new TopicStore(db);
    topic.setTopic("presence", { tags: ["room:a"] });
    await until(() => topic.getSnapshot().status === "live", "the watch");
    await db.append("presence", [{ tags: ["room:a"], data: { who: "alice" } }, { tags: ["room:b"], data: { who: "bob" } }, { tags: ["room:a"], data: { who: "carol" } }]);
    await until(() => topic.getSnapshot().records.length === 2, "two records of room a");
    assert.deepEqual(topic.getSnapshot().records.map((r) => r.data.who), ["alice", "carol"]);
    topic.close();
  } finally {
    db.close();
    await server.stop();
  }
});
