// The chat example in real headless Chromium: two browser contexts signed in as alice and bob
// against a real `sluice serve` running the example's setup.sql, functions.js and presence
// topic. Run with `npm test` (builds dist/ first); needs SLUICE_BIN (or ../../target/debug/
// sluice) and /usr/bin/chromium. Screenshots go to test-results/.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { chromium } from "playwright-core";
import { addMessage, addRooms, applySetup } from "../setup.mjs";
import { api, exampleDir, startServer } from "./server.mjs";

const CHROMIUM = process.env.CHROMIUM_BIN ?? "/usr/bin/chromium";
const CHROMIUM_ARGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];
/** How long the page may take to show something that the server has already committed. */
const VISIBLE_MS_MAX = 15_000;
const resultsDir = join(exampleDir, "test-results");

// Texts carry a per-run tag so that nothing from another run (or the page's own code) can match.
const seed = process.env.CHAT_TEST_SEED ?? randomBytes(4).toString("hex");
const text = {
  general: `Welcome to general ${seed}`,
  secret: `classified ${seed}: only alice reads this`,
  aliceSays: `hello bob, from alice ${seed}`,
  bobSays: `hi alice, bob here ${seed}`,
  secretLater: `psst ${seed}: alice alone in secret`,
  afterSecret: `back in general ${seed}`,
};
/** What bob's page and bob's socket must never contain. */
const forbiddenForBob = [text.secret, text.secretLater, 'data-room="secret"'];

let server;
let browser;
const pages = {};

function fail(message) {
  return `${message} (seed ${seed}; rerun with CHAT_TEST_SEED=${seed})`;
}

async function openAs(sub, forbidden) {
  const context = await browser.newContext({ viewport: { width: 1000, height: 640 } });
  // Watches the whole DOM from the first byte on: any forbidden text, even for one frame,
  // is recorded in window.__leaks.
  await context.addInitScript((forbidden) => {
    window.__leaks = [];
    const check = () => {
      const html = document.documentElement ? document.documentElement.outerHTML : "";
      for (const f of forbidden) if (html.includes(f) && !window.__leaks.includes(f)) window.__leaks.push(f);
    };
    new MutationObserver(check).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
  }, forbidden);
  const page = await context.newPage();
  const state = { page, context, frameLeaks: [], errors: [], warnings: [] };
  page.on("pageerror", (e) => state.errors.push(String(e)));
  // The SDK reports a checksum mismatch (and the page a failed presence append) with
  // console.warn: none is expected.
  page.on("console", (msg) => {
    if (msg.type() === "warning" || msg.type() === "error") state.warnings.push(`${msg.type()}: ${msg.text()}`);
  });
  // Every WebSocket frame the page receives, checked for forbidden text (MessagePack strings
  // are raw UTF-8, so a byte search finds them in binary frames too).
  page.on("websocket", (ws) => {
    ws.on("framereceived", ({ payload }) => {
      const bytes = typeof payload === "string" ? Buffer.from(payload) : payload;
      for (const f of forbidden) if (bytes.includes(Buffer.from(f))) state.frameLeaks.push(f);
    });
  });
  const url = new URL(server.pageUrl);
  url.searchParams.set("token", await server.token(sub));
  await page.goto(url.href);
  pages[sub] = state;
  return state;
}

const roomButton = (page, room) => page.locator(`[data-testid=rooms] [data-room="${room}"]`);
const presence = (page, user) => page.locator(`[data-testid=presence] li[data-user="${user}"]`);
const message = (page, body) => page.locator("[data-testid=messages] li .body", { hasText: body });

async function send(page, body) {
  await page.locator("[data-testid=composer]").fill(body);
  await page.locator("[data-testid=send]").click();
}

describe("chat example", { timeout: 90_000 }, () => {
  before(async () => {
    console.log(`chat test seed ${seed}`);
    server = await startServer();
    await applySetup(server);
    await addRooms(server, { general: ["alice", "bob"], secret: ["alice"] });
    await addMessage(server, { id: "m-general", room: "general", author: "alice", body: text.general });
    await addMessage(server, { id: "m-secret", room: "secret", author: "alice", body: text.secret });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  });

  after(async () => {
    // What each page logged, and how it looked at the end: the first things to read when a
    // wait above timed out.
    await mkdir(resultsDir, { recursive: true });
    for (const [sub, state] of Object.entries(pages)) {
      for (const line of [...state.errors, ...state.warnings]) console.log(`${sub}'s page: ${line}`);
      await state.page.screenshot({ path: join(resultsDir, `${sub}-end.png`) }).catch(() => {});
    }
    await browser?.close();
    await server?.stop();
  });

  test("the rules: bob can neither read nor write #secret through the API", async () => {
    const bob = await server.token("bob");
    const read = await api(server, bob, "POST", "/v1/query", { sql: "SELECT id, body FROM messages WHERE room = 'secret'" });
    assert.equal(read.status, 200, JSON.stringify(read.body));
    assert.deepEqual(read.body.rows, [], fail("bob read #secret's messages"));
    const rooms = await api(server, bob, "POST", "/v1/query", { sql: "SELECT id FROM rooms ORDER BY id" });
    assert.deepEqual(rooms.body.rows, [{ id: "general" }], fail("bob's rooms"));
    const sent = await api(server, bob, "POST", "/v1/call/send", { args: { room: "secret", body: "let me in" } });
    assert.equal(sent.status, 400, JSON.stringify(sent.body));
    assert.equal(sent.body.error.code, "function_error");
    assert.match(sent.body.error.message, /^forbidden: bob is not a member of room secret/);
    const direct = await api(server, bob, "POST", "/v1/mutate", {
      ops: [{ op: "insert", table: "messages", row: { id: "forged", room: "general", author: "alice", body: "forged" } }],
    });
    assert.equal(direct.status, 403, fail("a client inserted a message without the send function"));
    assert.equal(direct.body.error.code, "forbidden");
    const forged = await api(server, bob, "POST", "/v1/topics/presence/records", {
      records: [{ tags: ["room:general", "user:alice"], data: { user: "alice", state: "join" } }],
    });
    assert.equal(forged.status, 403, fail("bob appended presence as alice"));
  });

  test("alice and bob see each other's messages live; bob never sees #secret", async () => {
    const alice = await openAs("alice", []);
    const bob = await openAs("bob", forbiddenForBob);

    // Rooms: alice is in both, bob only in general (the room list is live and filtered by policy).
    await roomButton(alice.page, "general").waitFor({ timeout: VISIBLE_MS_MAX });
    await roomButton(alice.page, "secret").waitFor({ timeout: VISIBLE_MS_MAX });
    await bob.page.locator('[data-testid=rooms][data-status="live"]').waitFor({ timeout: VISIBLE_MS_MAX });
    await roomButton(bob.page, "general").waitFor({ timeout: VISIBLE_MS_MAX });
    assert.equal(await roomButton(bob.page, "secret").count(), 0, fail("bob's room list shows secret"));

    // Both open general (the first room) and see its message.
    await message(alice.page, text.general).waitFor({ timeout: VISIBLE_MS_MAX });
    await message(bob.page, text.general).waitFor({ timeout: VISIBLE_MS_MAX });
    // A mark in each page's JavaScript state: a reload would lose it.
    for (const p of [alice.page, bob.page]) await p.evaluate(() => (window.__mark = "not reloaded"));

    // Presence: each sees the other in general.
    await presence(alice.page, "bob").waitFor({ timeout: VISIBLE_MS_MAX });
    await presence(bob.page, "alice").waitFor({ timeout: VISIBLE_MS_MAX });

    // alice → bob, then bob → alice, live.
    await send(alice.page, text.aliceSays);
    await message(bob.page, text.aliceSays).waitFor({ timeout: VISIBLE_MS_MAX });
    assert.equal(await bob.page.locator(`[data-testid=messages] li[data-author="alice"]`, { hasText: text.aliceSays }).count(), 1);
    await send(bob.page, text.bobSays);
    await message(alice.page, text.bobSays).waitFor({ timeout: VISIBLE_MS_MAX });
    assert.equal(await alice.page.locator(`[data-testid=messages] li[data-author="bob"]`, { hasText: text.bobSays }).count(), 1);

    // alice posts in secret while bob watches general; then back in general. Once bob sees the
    // later message, everything committed before it (the secret post) has had its chance to
    // reach him.
    await roomButton(alice.page, "secret").click();
    await message(alice.page, text.secret).waitFor({ timeout: VISIBLE_MS_MAX });
    // Presence follows: alice left general (bob sees her go), and in secret she is alone.
    await presence(bob.page, "alice").waitFor({ state: "detached", timeout: VISIBLE_MS_MAX });
    await presence(alice.page, "alice").waitFor({ timeout: VISIBLE_MS_MAX });
    assert.equal(await presence(alice.page, "bob").count(), 0, fail("alice's presence in secret shows bob"));
    await send(alice.page, text.secretLater);
    await message(alice.page, text.secretLater).waitFor({ timeout: VISIBLE_MS_MAX });
    await roomButton(alice.page, "general").click();
    await message(alice.page, text.aliceSays).waitFor({ timeout: VISIBLE_MS_MAX });
    await send(alice.page, text.afterSecret);
    await presence(bob.page, "alice").waitFor({ timeout: VISIBLE_MS_MAX });
    await message(bob.page, text.afterSecret).waitFor({ timeout: VISIBLE_MS_MAX });

    // No reloads: the messages arrived over the live queries.
    for (const p of [alice.page, bob.page]) {
      assert.equal(await p.evaluate(() => window.__mark), "not reloaded", fail("a page reloaded"));
    }

    await mkdir(resultsDir, { recursive: true });
    await alice.page.screenshot({ path: join(resultsDir, "alice.png") });
    await bob.page.screenshot({ path: join(resultsDir, "bob.png") });

    assert.equal(await roomButton(bob.page, "secret").count(), 0, fail("bob's room list shows secret"));
    const bobText = await bob.page.locator("body").innerText();
    for (const f of [text.secret, text.secretLater]) assert.ok(!bobText.includes(f), fail(`bob's page shows "${f}"`));
    assert.deepEqual(await bob.page.evaluate(() => window.__leaks), [], fail("bob's DOM contained secret text at some point"));
    assert.deepEqual(bob.frameLeaks, [], fail("bob's WebSocket received secret text"));
    assert.deepEqual(alice.errors, [], fail("alice's page threw"));
    assert.deepEqual(bob.errors, [], fail("bob's page threw"));
    assert.deepEqual(alice.warnings, [], fail("alice's console"));
    assert.deepEqual(bob.warnings, [], fail("bob's console"));
    console.log(`alice's page: ${JSON.stringify(await alice.page.locator("[data-testid=messages]").innerText())}`);
    console.log(`bob's page: ${JSON.stringify(bobText)}`);
  });

  test("membership is data: bob added to #secret sees it appear live, removed sees it go", async () => {
    const bob = pages.bob;
    assert.ok(bob, "needs the pages of the previous test");
    // The rooms and messages policies read `members` through a subquery: a membership change
    // alone changes what bob's open live queries hold.
    await addRooms(server, { secret: ["bob"] });
    await roomButton(bob.page, "secret").waitFor({ timeout: VISIBLE_MS_MAX });
    await roomButton(bob.page, "secret").click();
    await message(bob.page, text.secret).waitFor({ timeout: VISIBLE_MS_MAX });
    await message(bob.page, text.secretLater).waitFor({ timeout: VISIBLE_MS_MAX });
    const removed = await api(server, server.adminToken, "POST", "/v1/mutate", {
      ops: [{ op: "delete", table: "members", id: "secret:bob" }],
    });
    assert.equal(removed.status, 200, JSON.stringify(removed.body));
    await roomButton(bob.page, "secret").waitFor({ state: "detached", timeout: VISIBLE_MS_MAX });
    await message(bob.page, text.secretLater).waitFor({ state: "detached", timeout: VISIBLE_MS_MAX });
    await message(bob.page, text.afterSecret).waitFor({ timeout: VISIBLE_MS_MAX }); // back in general
    assert.equal(await bob.page.evaluate(() => window.__mark), "not reloaded", fail("bob's page reloaded"));
    assert.deepEqual(bob.warnings, [], fail("bob's console"));

  });
});
