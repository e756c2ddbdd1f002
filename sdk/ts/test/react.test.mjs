// The React hooks themselves, rendered by react-test-renderer (no DOM): useLiveQuery follows
// new params keeping the previous rows until the new snapshot, useTopic shows records; under
// StrictMode (mount, unmount, mount) and after unmount nothing is left subscribed.

import { test } from "node:test";
import assert from "node:assert/strict";
import React from "react";
import TestRenderer from "react-test-renderer";
import { Server, until } from "./server.mjs";
import { SluiceProvider, useLiveQuery, useTopic, useSluice } from "../dist/react.js";

const h = React.createElement;
globalThis.IS_REACT_ACT_ENVIRONMENT = false;

test("useLiveQuery and useTopic render live rows and keep the previous rows while params change", { timeout: 60_000 }, async () => {
  const server = await new Server().start();
  const db = server.client();
  try {
    await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, room TEXT, body TEXT)");
    await db.http("PUT", "/v1/topics/presence", {});
    await db.mutate([
      { op: "insert", table: "msgs", row: { id: 1, room: "a", body: "a1" } },
      { op: "insert", table: "msgs", row: { id: 2, room: "b", body: "b1" } },
    ]);
    const frames = [];
    let sluice = null;
    function Room({ room }) {
      const { rows, status, error } = useLiveQuery("SELECT id, body FROM msgs WHERE room = $1 ORDER BY id", [room]);
      const presence = useTopic("presence", { tags: [`room:${room}`] });
      sluice = useSluice();
      frames.push({ room, status, ids: rows.map((r) => r.id), error: error?.code ?? null, presence: presence.records.map((r) => r.data) });
      return h("ul", null, rows.map((r) => h("li", { key: r.id }, r.body)));
    }
    const app = (room) => h(React.StrictMode, null, h(SluiceProvider, { client: db }, h(Room, { room })));
    const r = TestRenderer.create(app("a"));
    const last = () => frames.at(-1);
    await until(() => last().status === "live" && last().ids.join() === "1", "room a rendered live");
    assert.equal(sluice, db, "useSluice gives the provider's client");
    assert.deepEqual(r.toJSON().children.map((li) => li.children[0]), ["a1"]);

    await db.mutate([{ op: "insert", table: "msgs", row: { id: 3, room: "a", body: "a2" } }]);
    await until(() => last().ids.join() === "1,3", "the new row rendered");
    await until(() => frames.at(-1).status === "live", "");
    await db.append("presence", [{ tags: ["room:a"], data: "alice" }]);
    await until(() => last().presence.join() === "alice", "presence rendered");

    const from = frames.length;
    r.update(app("b"));
    await until(() => last().room === "b" && last().status === "live" && last().ids.join() === "2", "room b rendered live");
    for (const f of frames.slice(from)) {
      if (f.status !== "live") assert.deepEqual(f.ids, [1, 3], `while loading, room a's rows stay: ${JSON.stringify(frames.slice(from))}`);
    }
    assert.ok(!frames.slice(from).some((f) => f.ids.length === 0), "never an empty list in between");

    r.unmount();
    // After unmount every subscription and watch is closed on the client.
    await until(() => db.streams.size === 0 && db.watches.size === 0, "no stream left after unmount");
  } finally {
    db.close();
    await server.stop();
  }
});
