// The protocol conformance suite (`sluice conformance`, issue 11 point 4) against the same
// kind of server the SDK tests use: skipped with the reason when the binary has no such
// subcommand yet.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync, spawn } from "node:child_process";
import { Server, BIN, ADMIN } from "./server.mjs";

const has = spawnSync(BIN, ["conformance", "--help"], { encoding: "utf8" }).status === 0;

test("sluice conformance passes against the server", { timeout: 120_000, skip: !has && `${BIN} has no conformance subcommand` }, async () => {
  const secret = "sdk-conformance-secret";
  const server = await new Server({ jwtSecret: secret }).start();
  try {
    const child = spawn(BIN, ["conformance", "--url", server.url, "--token", ADMIN, "--jwt-secret", secret], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    const code = await new Promise((r) => child.on("exit", r));
    const summary = /(\d+) passed, (\d+) failed(?:, (\d+) skipped)?/.exec(out);
    console.log(`# conformance: ${summary ? summary[0] : "no summary"}`);
    assert.ok(summary, `no "N passed, M failed" line:\n${out.slice(-3000)}`);
    assert.equal(Number(summary[2]), 0, `failed checks:\n${out.split("\n").filter((l) => l.startsWith("FAIL")).join("\n")}`);
    assert.equal(code, 0);
  } finally {
    await server.stop();
  }
});
