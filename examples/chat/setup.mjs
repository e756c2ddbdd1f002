// Applies the chat example's setup to a running server with the admin token:
// setup.sql (tables, indexes, read policies) and the `presence` topic with its rules;
// with --demo, also rooms `general` (alice, bob) and `secret` (alice only) and a message in each.
//
//   node setup.mjs --url http://127.0.0.1:7070 --admin-token T [--demo]
//
// Also imported by the test (test/chat.test.mjs). Node 20+, no dependencies.
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";

/** The presence topic: short-lived records, appended by users under their own `user:` tag. */
export const PRESENCE_TOPIC = "presence";
export const PRESENCE_RULES = {
  retain_records: 10000,
  retain_secs: 3600,
  // Clients watch a room's presence by its tag. Every tag of an appended record must match an
  // append rule, so a record carries `room:<id>` (any room) and `user:<the caller's sub>` —
  // a user cannot append as someone else. (Room ids are visible to anyone who guesses them
  // here: presence says who is in a room, not what is said in it.)
  read: ["room:*"],
  append: ["room:*", "user:{auth.sub}"],
};

export class SetupError extends Error {
  constructor(step, status, body) {
    super(`${step}: HTTP ${status}: ${body}`);
    this.step = step;
    this.status = status;
  }
}

async function request(url, adminToken, method, path, body, step) {
  const res = await fetch(new URL(path, url), {
    method,
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new SetupError(step, res.status, text);
  return text === "" ? null : JSON.parse(text);
}

/** setup.sql and the presence topic. Idempotent. */
export async function applySetup({ url, adminToken }) {
  const sql = await readFile(fileURLToPath(new URL("./setup.sql", import.meta.url)), "utf8");
  await request(url, adminToken, "POST", "/v1/sql", { sql }, "setup.sql");
  await request(url, adminToken, "PUT", `/v1/topics/${PRESENCE_TOPIC}`, PRESENCE_RULES, "presence topic");
}

/** Adds rooms and members: `rooms` maps a room id to its members' subs. */
export async function addRooms({ url, adminToken }, rooms) {
  const ops = [];
  for (const [room, users] of Object.entries(rooms)) {
    ops.push({ op: "upsert", table: "rooms", row: { id: room, name: room } });
    for (const user of users) {
      ops.push({ op: "upsert", table: "members", row: { id: `${room}:${user}`, room, user_id: user } });
    }
  }
  return request(url, adminToken, "POST", "/v1/mutate", { ops }, "rooms and members");
}

/** Adds a message as the admin (clients write through the `send` function instead). */
export async function addMessage({ url, adminToken }, { id, room, author, body, ts }) {
  const row = { id, room, author, body, ts: ts ?? Date.now() * 1000 };
  return request(url, adminToken, "POST", "/v1/mutate", { ops: [{ op: "upsert", table: "messages", row }] }, "message");
}

export const DEMO_ROOMS = { general: ["alice", "bob"], secret: ["alice"] };

export async function addDemo(server) {
  await addRooms(server, DEMO_ROOMS);
  await addMessage(server, { id: "demo-general", room: "general", author: "alice", body: "Welcome to #general" });
  await addMessage(server, { id: "demo-secret", room: "secret", author: "alice", body: "Only alice can read #secret" });
}

function parseArgs(argv) {
  const args = { url: process.env.SLUICE_URL ?? "http://127.0.0.1:7070", adminToken: process.env.SLUICE_ADMIN_TOKEN, demo: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--url") args.url = argv[++i];
    else if (a === "--admin-token") args.adminToken = argv[++i];
    else if (a === "--demo") args.demo = true;
    else throw new Error(`unknown argument ${a}; usage: node setup.mjs --url URL --admin-token T [--demo]`);
  }
  if (!args.adminToken) throw new Error("no admin token: pass --admin-token T or set SLUICE_ADMIN_TOKEN");
  return args;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  try {
    const args = parseArgs(process.argv.slice(2));
    await applySetup(args);
    if (args.demo) await addDemo(args);
    console.log(`setup applied to ${args.url}${args.demo ? " (with demo rooms general and secret)" : ""}`);
  } catch (e) {
    console.error(`setup failed: ${e.message}`);
    process.exit(1);
  }
}
