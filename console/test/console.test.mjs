// The admin console in real headless Chromium (Debian's /usr/bin/chromium via playwright-core)
// against a real `sluice serve`: sign in (a wrong token refused with the server's reason),
// create a table in the SQL box, keep a SELECT live while the test process writes over HTTP
// and see the row appear without a reload, browse the table, export CSV, preview what a
// client with some claims would see, and save a screenshot to test-results/console.png.
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { api, assetsDir, repoRoot, sluiceBin, startProxy, startServer } from "./harness.mjs";

const ADMIN = "console-test-admin-token";
const JWT_SECRET = "console-test-jwt-secret";
const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
const RESULTS = join(repoRoot, "console", "test-results");
const STEP_MS = 15_000;

test("the console signs in, runs a live query that shows rows written by another process, browses, exports and previews policies", { timeout: 90_000 }, async (t) => {
  mkdirSync(RESULTS, { recursive: true });
  // Where the page comes from (CONSOLE_TEST_SERVE): "embedded" — the server's own /console/;
  // "public" — the built files served by the server's `--public DIR` at / (the real static
  // serving, before a binary embeds them); "proxy" — a same-origin proxy in this process for
  // servers without static serving; "auto" (default) — embedded when GET / redirects to
  // /console/ (docs/api.md), else proxy.
  const mode = process.env.CONSOLE_TEST_SERVE || "auto";
  assert.ok(["auto", "embedded", "public", "proxy"].includes(mode), `CONSOLE_TEST_SERVE=${mode}`);
  const server = await startServer(ADMIN, ["--jwt-secret", JWT_SECRET, ...(mode === "public" ? ["--public", assetsDir] : [])]);
  let proxy = null;
  let browser = null;
  let page = null;
  const http = (method, path, body) => api(server.url, ADMIN, method, path, body);
  try {
    let pageUrl = `${server.url}/console/`;
    if (mode === "public") {
      pageUrl = `${server.url}/`;
      t.diagnostic(`the built assets are served by the server's --public at ${pageUrl}`);
    } else {
      const root = await fetch(`${server.url}/`, { redirect: "manual" });
      if (mode === "proxy" || (mode === "auto" && root.status !== 302)) {
        proxy = await startProxy(server.url);
        pageUrl = `${proxy.url}/console/`;
        t.diagnostic(`serving the built assets through a proxy at ${pageUrl} (GET / → ${root.status})`);
      } else {
        assert.equal(root.status, 302, "GET / redirects to the console");
        const probe = await fetch(pageUrl);
        assert.equal(probe.status, 200, "GET /console/ serves the console without a token");
        assert.match(await probe.text(), /<div id="root"><\/div>/, "GET /console/ is the built console's index.html, not a placeholder");
        t.diagnostic(`the server serves the console itself at ${pageUrl}`);
      }
    }

    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
    const context = await browser.newContext({ acceptDownloads: true, viewport: { width: 1280, height: 800 } });
    page = await context.newPage();
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    page.setDefaultTimeout(STEP_MS);

    await page.goto(pageUrl);

    await t.test("a wrong token is refused with the server's 401 reason", async () => {
      await page.fill("input[name=token]", "not-the-token");
      await page.click("button[type=submit]");
      const alert = page.locator(".signin [role=alert]");
      await alert.waitFor();
      const text = await alert.textContent();
      assert.match(text, /^Refused: /);
      assert.match(text, /reason: malformed/);
      assert.equal(await page.locator("header").count(), 0, "not signed in");
      assert.equal(await page.evaluate(() => sessionStorage.length + localStorage.length), 0, "a refused token is not stored");
    });

    await t.test("a client's token is refused: the console is for the admin", async () => {
      const jwt = execFileSync(sluiceBin(), ["token", "--secret", JWT_SECRET, "--sub", "alice", "--ttl", "1h"], { encoding: "utf8" }).trim();
      await page.fill("input[name=token]", jwt);
      await page.click("button[type=submit]");
      await page.locator(".signin [role=alert]", { hasText: "not the admin token" }).waitFor();
      assert.equal(await page.locator("header").count(), 0, "not signed in");
    });

    await t.test("the admin token signs in and is kept in sessionStorage", async () => {
      await page.fill("input[name=token]", ADMIN);
      await page.click("button[type=submit]");
      await page.locator("header .brand").waitFor();
      assert.equal(await page.evaluate(() => sessionStorage.getItem("sluice.console.token")), ADMIN);
      assert.equal(await page.evaluate(() => localStorage.getItem("sluice.console.token")), null);
    });

    await t.test("a reload keeps the session; remember keeps the token in localStorage instead", async () => {
      await page.reload();
      await page.locator("header .brand").waitFor();
      await page.click("header button:has-text('Sign out')");
      await page.fill("input[name=token]", ADMIN);
      await page.check(".signin input[type=checkbox]");
      await page.click("button[type=submit]");
      await page.locator("header .brand").waitFor();
      assert.equal(await page.evaluate(() => localStorage.getItem("sluice.console.token")), ADMIN);
      assert.equal(await page.evaluate(() => sessionStorage.getItem("sluice.console.token")), null);
    });

    await t.test("the SQL box creates a table", async () => {
      await page.click("button[data-tab=SQL]");
      await page.fill("textarea[name=sql]", "CREATE TABLE msgs (id INTEGER PRIMARY KEY, room TEXT NOT NULL, body TEXT, likes INTEGER DEFAULT 0)");
      await page.click("button[data-action=run]");
      await page.locator(".results .status", { hasText: "schema changed" }).waitFor();
      const { tables } = await http("GET", "/v1/tables");
      assert.deepEqual(tables.map((x) => x.name), ["msgs"]);
    });

    await t.test("a live SELECT shows a row written over HTTP by the test process, without a reload", async () => {
      await http("POST", "/v1/mutate", {
        ops: [
          { op: "insert", table: "msgs", row: { id: 1, room: "a", body: "first" } },
          { op: "insert", table: "msgs", row: { id: 2, room: "b", body: "second" } },
        ],
      });
      await page.evaluate(() => {
        window.__notReloaded = true;
      });
      await page.fill("textarea[name=sql]", "SELECT id, room, body FROM msgs ORDER BY id");
      await page.click("button[data-action=run]");
      await page.locator(".live-status[data-status=live]").waitFor();
      assert.deepEqual(await liveColumn(page, 3), ["first", "second"]);
      assert.equal(await page.locator(".results tr.flash").count(), 0, "the first snapshot flashes nothing");

      await http("POST", "/v1/mutate", { ops: [{ op: "insert", table: "msgs", row: { id: 3, room: "a", body: "hello from the test" } }] });
      await page.locator(".results table.rows td", { hasText: "hello from the test" }).waitFor();
      assert.equal(await page.locator(".results tr.flash", { hasText: "hello from the test" }).count(), 1, "the new row flashes");
      assert.deepEqual(await liveColumn(page, 3), ["first", "second", "hello from the test"]);

      await http("POST", "/v1/mutate", { ops: [{ op: "patch", table: "msgs", id: 1, set: { body: "edited elsewhere" } }] });
      await page.locator(".results table.rows td", { hasText: "edited elsewhere" }).waitFor();
      assert.deepEqual(await liveColumn(page, 3), ["edited elsewhere", "second", "hello from the test"]);
      assert.equal(await page.evaluate(() => window.__notReloaded), true, "the page was not reloaded");
      await page.screenshot({ path: join(RESULTS, "console.png"), fullPage: true });
    });

    await t.test("the table browser shows the rows, and an edited cell is written with patch", async () => {
      await page.click("button[data-tab=Tables]");
      await page.click("aside button[data-table=msgs]");
      const grid = page.locator("table[data-rows-of=msgs]");
      await grid.locator("td", { hasText: "hello from the test" }).waitFor();
      assert.equal(await grid.locator("tbody tr").count(), 3);

      await grid.locator("td", { hasText: "second" }).dblclick();
      await grid.locator("input[name=body]").fill("changed in the console");
      await grid.locator("input[name=body]").press("Enter");
      await grid.locator("td", { hasText: "changed in the console" }).waitFor();
      const { row } = await http("GET", "/v1/tables/msgs/rows/2");
      assert.equal(row.body, "changed in the console");

      // A value of the wrong type is refused in the page, inline, and nothing is written.
      await grid.locator("tr", { hasText: "changed in the console" }).locator("td:nth-child(4)").dblclick();
      await grid.locator("input[name=likes]").fill("many");
      await grid.locator("input[name=likes]").press("Enter");
      await grid.locator(".error.inline", { hasText: "not an integer: many" }).waitFor();
      await grid.locator("input[name=likes]").fill("5");
      await grid.locator("input[name=likes]").press("Enter");
      await grid.locator("tr", { hasText: "changed in the console" }).locator("td:nth-child(4)", { hasText: /^5$/ }).waitFor();
      assert.equal((await http("GET", "/v1/tables/msgs/rows/2")).row.likes, 5);

      // NULL in a NOT NULL column is refused by the server, whose error is shown inline.
      await grid.locator("td", { hasText: /^b$/ }).dblclick();
      await grid.locator(".editor button", { hasText: "NULL" }).click();
      const err = grid.locator(".error.inline");
      await err.waitFor();
      assert.match(await err.textContent(), /^schema: /);
      await grid.locator("input[name=room]").press("Escape");
      assert.equal((await http("GET", "/v1/tables/msgs/rows/2")).row.room, "b");
      await page.screenshot({ path: join(RESULTS, "console-tables.png"), fullPage: true });
    });

    await t.test("the filter box narrows the rows with a WHERE clause", async () => {
      const grid = page.locator("table[data-rows-of=msgs]");
      await page.fill("input[name=filter]", "room = 'a'");
      await page.click("form.filter button[type=submit]");
      await page.locator(".pager", { hasText: "where room = 'a'" }).waitFor();
      assert.equal(await grid.locator("tbody tr").count(), 2);
      await page.click("form.filter button:has-text('Clear')");
      await grid.locator("td", { hasText: "changed in the console" }).waitFor();
    });

    await t.test("Export CSV downloads every row of the table", async () => {
      const [download] = await Promise.all([page.waitForEvent("download"), page.click("button:has-text('Export CSV')")]);
      assert.equal(download.suggestedFilename(), "msgs.csv");
      const csv = readFileSync(await download.path(), "utf8");
      assert.equal(csv, "id,room,body,likes\r\n1,a,edited elsewhere,0\r\n2,b,changed in the console,5\r\n3,a,hello from the test,0\r\n");
      await page.locator(".export-status", { hasText: "exported 3 rows" }).waitFor();
    });

    await t.test("a row inserted and deleted in the table browser is written and removed", async () => {
      page.once("dialog", (d) => void d.accept());
      const grid = page.locator("table[data-rows-of=msgs]");
      await page.click("button:has-text('Insert row')");
      const form = grid.locator("tr.insert");
      await form.locator("input[name=id]").fill("4");
      await form.locator("input[name=room]").fill("c");
      await form.locator("input[name=body]").fill("inserted in the console");
      await form.locator("button:has-text('Save')").click();
      await grid.locator("td", { hasText: "inserted in the console" }).waitFor();
      const { row } = await http("GET", "/v1/tables/msgs/rows/4");
      assert.deepEqual(row, { id: 4, room: "c", body: "inserted in the console", likes: 0 }, "omitted likes took its default");
      await grid.locator("tr", { hasText: "inserted in the console" }).locator("button:has-text('Delete')").click();
      await grid.locator("td", { hasText: "inserted in the console" }).waitFor({ state: "detached" });
      await assert.rejects(http("GET", "/v1/tables/msgs/rows/4"), (e) => e.status === 404);
    });

    await t.test("a big table pages forward and back with a bounded page size", async () => {
      await http("POST", "/v1/sql", { sql: "CREATE TABLE big (k INTEGER PRIMARY KEY, v TEXT)" });
      const ops = [];
      for (let k = 1; k <= 120; k++) ops.push({ op: "insert", table: "big", row: { k, v: `v${k}` } });
      await http("POST", "/v1/mutate", { ops });
      await page.click("aside button:has-text('↻')");
      await page.click("aside button[data-table=big]");
      const grid = page.locator("table[data-rows-of=big]");
      await grid.locator("td", { hasText: /^v1$/ }).waitFor();
      const firstCol = () => grid.locator("tbody tr td:nth-child(1)").allTextContents();
      assert.equal((await firstCol()).length, 50);
      await page.click("button:has-text('Next page')");
      await grid.locator("td", { hasText: /^v51$/ }).waitFor();
      assert.deepEqual([(await firstCol())[0], (await firstCol()).at(-1)], ["51", "100"]);
      await page.click("button:has-text('Next page')");
      await grid.locator("td", { hasText: /^v101$/ }).waitFor();
      assert.equal((await firstCol()).length, 20);
      assert.equal(await page.locator("button:has-text('Next page')").isDisabled(), true, "the last page has no next");
      await page.click("button:has-text('Previous')");
      await grid.locator("td", { hasText: /^v51$/ }).waitFor();
      const [download] = await Promise.all([page.waitForEvent("download"), page.click("button:has-text('Export JSON')")]);
      const exported = JSON.parse(readFileSync(await download.path(), "utf8"));
      assert.equal(exported.length, 120);
      assert.deepEqual(exported[119], { k: 120, v: "v120" });
      await page.click("aside button[data-table=msgs]");
    });

    await t.test("the topic tail shows only records whose tags match, as they are appended", async () => {
      await http("PUT", "/v1/topics/events");
      await page.click("button[data-tab=Topics]");
      await page.locator("aside button", { hasText: "events" }).click();
      await page.fill("input[name=tags]", "room:*");
      await page.click("button:has-text('Tail')");
      await page.locator(".live-status.live").waitFor();
      await http("POST", "/v1/topics/events/records", {
        records: [
          { tags: ["room:1"], data: { text: "in room 1" } },
          { tags: ["user:9"], data: { text: "not for this tail" } },
          { tags: ["room:2", "user:9"], data: { text: "in room 2" } },
        ],
      });
      await page.locator("td code", { hasText: "in room 2" }).waitFor();
      const data = await page.locator(".results tbody tr td:nth-child(4)").allTextContents();
      assert.deepEqual(data, ['{"text":"in room 2"}', '{"text":"in room 1"}'], "newest first, the user:9-only record filtered out");
    });

    await t.test("the policies preview shows fewer rows for a client's claims", async (st) => {
      await http("POST", "/v1/sql", { sql: "CREATE POLICY room_read ON msgs FOR SELECT USING (room = auth.room)" });
      const supportsAs = await http("POST", "/v1/query", { sql: "SELECT * FROM msgs", as: { sub: "alice", room: "a" } }).then(
        () => true,
        (e) => {
          if (e.status === 400 && /unknown field "as"/.test(e.body?.error?.message ?? "")) return false;
          throw e;
        },
      );
      await page.click("button[data-tab=Policies]");
      await page.click("aside button[data-table=msgs]");
      await page.locator("td", { hasText: "room_read" }).waitFor();
      assert.equal(await page.locator("td code", { hasText: "room = auth.room" }).count(), 1);
      if (!supportsAs) {
        st.skip('this server refuses "as" in /v1/query (not landed yet): the preview is not checked');
        return;
      }
      await page.fill("textarea[name=claims]", '{"sub": "alice", "room": "a"}');
      await page.click("button[data-action=preview]");
      const status = page.locator("[data-preview-count]");
      await status.waitFor();
      assert.equal(await status.getAttribute("data-preview-count"), "2");
      assert.match(await status.textContent(), /the admin sees 3/);
    });

    await t.test("the SQL box runs several writes as one transaction and names a failing statement", async () => {
      await page.click("button[data-tab=SQL]");
      await page.fill("textarea[name=sql]", "UPDATE big SET v = 'changed' WHERE k = 1; DELETE FROM big WHERE k >= 119");
      await page.click("button[data-action=run]");
      await page.locator(".result", { hasText: "statement 2: delete · 2 rows" }).waitFor();
      assert.equal(await page.locator(".result", { hasText: "statement 1: update · 1 row" }).count(), 1);
      assert.equal((await http("GET", "/v1/tables/big/rows/1")).row.v, "changed");

      await page.fill("textarea[name=sql]", "INSERT INTO big (k, v) VALUES (500, 'new'); INSERT INTO big (k, v) VALUES (1, 'dup')");
      await page.click("button[data-action=run]");
      const err = page.locator("[role=alert]", { hasText: "already_exists" });
      await err.waitFor();
      assert.match(await err.textContent(), /^statement 2 failed, nothing was applied — already_exists: /);
      await assert.rejects(http("GET", "/v1/tables/big/rows/500"), (e) => e.status === 404, "all or nothing");

      await page.fill("textarea[name=sql]", "SELECT nope FROM big");
      await page.click("button[data-action=run]");
      const status = page.locator(".live-status[data-status=error]");
      await status.waitFor();
      assert.match(await status.textContent(), /nope/, "a live query that does not plan shows the server's error");

      await page.fill("textarea[name=sql]", "SELECT 1 + 2 AS three");
      await page.click("button[data-action=run]");
      await page.locator(".result", { hasText: "statement 1: select · 1 row" }).waitFor();
      assert.deepEqual(await page.locator(".result tbody td").allTextContents(), ["3"]);
    });

    await t.test("the metrics tab draws a chart per series from /metrics", async () => {
      await page.click("button[data-tab=Metrics]");
      await page.locator(".chart[data-series=commits] polyline").waitFor({ state: "attached" });
      for (const id of ["commits", "syncs", "fsync", "fsync_p99", "views", "subscribers", "handoff", "lagging"]) {
        assert.equal(await page.locator(`.chart[data-series=${id}]`).count(), 1, `a chart for ${id}`);
      }
      await page.screenshot({ path: join(RESULTS, "console-metrics.png"), fullPage: true });
    });

    assert.deepEqual(pageErrors, [], "no uncaught error in the page");
  } catch (e) {
    if (page) await page.screenshot({ path: join(RESULTS, "console-failure.png"), fullPage: true }).catch(() => {});
    t.diagnostic(`sluice log:\n${server.log()}`);
    throw e;
  } finally {
    await browser?.close();
    await proxy?.stop();
    await server.stop();
  }
});

/** The third column (body) of the live result, top to bottom. */
async function liveColumn(page, n) {
  return page.locator(`.results table.rows tbody tr td:nth-child(${n})`).allTextContents();
}
