// The console's pure helpers (values by type, CSV, /metrics parsing), bundled on the fly by
// esbuild from src/ so they are tested as the page runs them.
import assert from "node:assert/strict";
import { test } from "node:test";
import { build } from "esbuild";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const src = join(dirname(fileURLToPath(import.meta.url)), "..", "src");
async function load(file) {
  const out = await build({ entryPoints: [join(src, file)], bundle: true, write: false, format: "esm", logLevel: "silent" });
  return import(`data:text/javascript;base64,${Buffer.from(out.outputFiles[0].text).toString("base64")}`);
}
const values = await load("values.ts");
const prom = await load("prom.ts");

test("cell text parses by column type and names what is wrong", () => {
  const { parseValue } = values;
  assert.equal(parseValue("42", "INTEGER"), 42);
  assert.throws(() => parseValue("4.5", "integer"), /not an integer: 4.5/);
  assert.throws(() => parseValue("9007199254740993", "integer"), /not an integer/);
  assert.equal(parseValue("2.5", "REAL"), 2.5);
  assert.equal(parseValue("true", "boolean"), true);
  assert.throws(() => parseValue("yes", "boolean"), /not a boolean/);
  assert.deepEqual(parseValue('{"a": [1]}', "json"), { a: [1] });
  assert.throws(() => parseValue("{", "json"), /not JSON/);
  assert.equal(parseValue("1700000000000000", "timestamp"), 1700000000000000);
  assert.equal(parseValue("2023-11-14T22:13:20Z", "timestamp"), 1700000000000000);
  assert.equal(parseValue("", "integer"), null, "empty is NULL for a nullable non-text column");
  assert.throws(() => parseValue("", "integer", false), /NOT NULL/);
  assert.equal(parseValue("", "text"), "", "empty text stays an empty string");
});

test("CSV quotes what needs quoting and leaves NULL empty", () => {
  const csv = values.toCsv(["id", "t", "j"], [
    { id: 1, t: 'say "hi", then\nleave', j: { a: 1 } },
    { id: 2, t: null, j: [1, 2] },
    { id: 3, t: " padded", j: "x" },
  ]);
  assert.equal(csv, 'id,t,j\r\n1,"say ""hi"", then\nleave","{""a"":1}"\r\n2,,"[1,2]"\r\n3," padded",x\r\n');
});

test("metrics series come from two samples of /metrics", () => {
  const { parseMetrics, SERIES } = prom;
  const text = (commits, syncs, sum, b) =>
    [
      "# HELP sluice_commits_total x",
      `sluice_commits_total ${commits}`,
      `sluice_log_syncs_total ${syncs}`,
      "sluice_live_views 3",
      `sluice_log_sync_seconds_bucket{le="0.000001"} ${b[0]}`,
      `sluice_log_sync_seconds_bucket{le="0.001024"} ${b[1]}`,
      `sluice_log_sync_seconds_bucket{le="0.002048"} ${b[2]}`,
      `sluice_log_sync_seconds_bucket{le="+Inf"} ${syncs}`,
      `sluice_log_sync_seconds_sum ${sum}`,
      `sluice_log_sync_seconds_count ${syncs}`,
    ].join("\n");
  const a = parseMetrics(text(10, 5, 0.005, [0, 5, 5]), 1000);
  const b = parseMetrics(text(30, 105, 0.105, [0, 5, 105]), 3000);
  const point = (id) => SERIES.find((s) => s.id === id).point(a, b);
  assert.equal(point("commits"), 10, "20 commits in 2 s");
  assert.equal(point("syncs"), 50);
  assert.ok(Math.abs(point("fsync") - 1) < 1e-9, "0.1 s over 100 syncs = 1 ms mean");
  assert.equal(point("fsync_p99"), 2.048, "every sync of the interval fell in the 2.048 ms bucket");
  assert.equal(point("views"), 3);
  assert.equal(SERIES.find((s) => s.id === "commits").point(null, b), null, "a rate needs two samples");
});
