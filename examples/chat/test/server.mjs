// Starts a real `sluice serve` for the chat tests: fresh data dir, port chosen by the OS,
// the chat's functions and `--public dist` (the page is served by sluice itself).
import { execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
export const exampleDir = fileURLToPath(new URL("..", import.meta.url));
export const distDir = join(exampleDir, "dist");
export const sluiceBin = process.env.SLUICE_BIN ?? join(exampleDir, "../../target/debug/sluice");

const STARTUP_MS_MAX = 20_000;

export async function startServer() {
  if (!existsSync(sluiceBin)) throw new Error(`no sluice binary at ${sluiceBin} (set SLUICE_BIN)`);
  if (!existsSync(join(distDir, "index.html"))) throw new Error(`no ${distDir}/index.html: run npm run build`);
  const dataDir = await mkdtemp(join(tmpdir(), "sluice-chat-"));
  const adminToken = `chat_admin_${randomBytes(12).toString("hex")}`;
  const jwtSecret = randomBytes(24).toString("hex");
  const args = [
    "serve",
    "--data", dataDir,
    "--listen", "127.0.0.1:0",
    "--admin-token", adminToken,
    "--jwt-secret", jwtSecret,
    "--functions", join(exampleDir, "functions.js"),
    "--durability", "memory",
    "--public", distDir,
  ];
  const child = spawn(sluiceBin, args, { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const listening = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`sluice did not say "listening" within ${STARTUP_MS_MAX} ms; log:\n${log}`)), STARTUP_MS_MAX);
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      log += chunk;
      const m = /listening on (http:\/\/[0-9.]+:[0-9]+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`sluice exited (${code ?? signal}) before listening; log:\n${log}`));
    });
  });
  let url;
  try {
    url = await listening;
  } catch (e) {
    child.kill("SIGKILL");
    await rm(dataDir, { recursive: true, force: true });
    throw e;
  }
  return {
    url,
    /** Where the browser opens the page, served by sluice itself (`?token=` is added by the caller). */
    pageUrl: `${url}/`,
    adminToken,
    jwtSecret,
    log: () => log,
    /** A client token for `sub`, minted by `sluice token` like a developer would. */
    async token(sub) {
      const { stdout } = await run(sluiceBin, ["token", "--secret", jwtSecret, "--sub", sub, "--ttl", "1h"]);
      return stdout.trim();
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve));
        child.kill("SIGKILL");
        await exited;
      }
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** Calls the HTTP API as `token`; resolves to {status, body}. */
export async function api(server, token, method, path, body) {
  const res = await fetch(new URL(path, server.url), {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text === "" ? null : JSON.parse(text) };
}
