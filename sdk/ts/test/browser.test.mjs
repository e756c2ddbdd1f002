// The SDK in real headless Chromium (Debian's /usr/bin/chromium, never a downloaded one): the
// browser's own WebSocket, hash-wasm's WebAssembly, ESM as shipped in dist/. A live query in
// the page follows writes made from this process, with every checksum verified.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { dirname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { Server, ADMIN } from "./server.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";

const PAGE = `<!doctype html><meta charset="utf-8">
<script type="importmap">{"imports": {"hash-wasm": "/hash-wasm.js"}}</script>
<script type="module">
  import { connect } from "/sdk/index.js";
  window.start = (url, token, encoding) => {
    const db = connect({ url, token, encoding });
    const live = db.live("SELECT id, body, score FROM msgs ORDER BY id");
    window.state = () => ({ status: live.status, rows: live.rows, verified: live.checksumsVerified, mismatches: live.checksumMismatches, error: live.error && live.error.message, client: db.status });
    window.write = (id) => db.mutate([{ op: "insert", table: "msgs", row: { id, body: "from the page " + id, score: id / 2 } }]).then((r) => r.seq);
  };
  window.ready = true;
</script>`;

/** A static server for the page, dist/ and hash-wasm's ESM build. */
async function pageServer() {
  const srv = createServer(async (req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    let file = null;
    let type = "text/javascript";
    if (path === "/" || path === "/index.html") return res.writeHead(200, { "content-type": "text/html" }).end(PAGE);
    if (path === "/hash-wasm.js") file = join(root, "node_modules/hash-wasm/dist/index.esm.js");
    else if (path.startsWith("/sdk/")) file = join(root, "dist", normalize(path.slice(5)).replace(/^(\.\.[/\\])+/, ""));
    if (!file || !existsSync(file)) return res.writeHead(404).end();
    if (file.endsWith(".map")) type = "application/json";
    res.writeHead(200, { "content-type": type }).end(await readFile(file));
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { srv, url: `http://127.0.0.1:${srv.address().port}` };
}

test("the SDK runs in headless Chromium: live rows follow writes from outside and from the page", { timeout: 60_000, skip: !existsSync(CHROMIUM) && `no ${CHROMIUM}` }, async () => {
  const server = await new Server().start();
  const page = await pageServer();
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const db = server.client();
  try {
    await db.sql("CREATE TABLE msgs (id INTEGER PRIMARY KEY, body TEXT, score REAL)");
    await db.mutate([{ op: "insert", table: "msgs", row: { id: 1, body: "first", score: 0.5 } }]);
    for (const encoding of ["msgpack", "json"]) {
      const ctx = await browser.newContext();
      const tab = await ctx.newPage();
      const errors = [];
      tab.on("pageerror", (e) => errors.push(String(e)));
      await tab.goto(page.url);
      await tab.waitForFunction(() => window.ready === true);
      await tab.evaluate(([u, t, e]) => window.start(u, t, e), [server.url, ADMIN, encoding]);
      await tab.waitForFunction(() => window.state().status === "live", null, { timeout: 15_000 });

      const base = encoding === "json" ? 100 : 10;
      await db.mutate([{ op: "insert", table: "msgs", row: { id: base, body: "from node", score: 1.25 } }]);
      await tab.waitForFunction((id) => window.state().rows.some((r) => r.id === id), base, { timeout: 15_000 });
      const seq = await tab.evaluate((id) => window.write(id), base + 1);
      assert.ok(seq > 0);
      await tab.waitForFunction((id) => window.state().rows.some((r) => r.id === id), base + 1, { timeout: 15_000 });

      const state = await tab.evaluate(() => window.state());
      const q = await db.query("SELECT id, body, score FROM msgs ORDER BY id");
      assert.deepEqual(state.rows, q.rows, `${encoding}: the page's rows equal a one-shot query`);
      assert.equal(state.mismatches, 0);
      assert.ok(state.verified >= 3, `${encoding}: checksums verified in the page: ${state.verified}`);
      assert.equal(state.client, "open");
      assert.deepEqual(errors, []);
      await ctx.close();
    }
  } finally {
    db.close();
    await browser.close();
    page.srv.close();
    await server.stop();
  }
});
