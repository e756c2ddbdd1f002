// Starts a real `sluice serve` for the chat tests: fresh data dir, port chosen by the OS,
// the chat's functions and (when the binary has the flag) `--public dist`.
import { execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer } from "node:http";
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
  ];
  // `--public` lands with the server's static files; until the binary has it, the test serves
  // dist/ itself and points the page at the server with `?server=` (said in the test's output).
  const { stdout: help } = await run(sluiceBin, ["serve", "--help"]);
  const hasPublic = help.includes("--public");
  if (hasPublic) args.push("--public", distDir);
  const child = spawn(sluiceBin, args, { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const url = await new Promise((resolve, reject) => {
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
  const standIn = hasPublic ? null : await serveDist();
  return {
    url,
    /** Where the browser opens the page (`?token=` is added by the caller). */
    pageUrl: hasPublic ? `${url}/` : `${standIn.url}/?server=${encodeURIComponent(url)}`,
    hasPublic,
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
      if (standIn) await new Promise((resolve) => standIn.server.close(resolve));
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** dist/ over HTTP on a free loopback port: only for a binary without `--public`. */
async function serveDist() {
  const server = createServer(async (req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    const file = path === "/" ? "index.html" : path.slice(1);
    if (file.includes("..") || file.includes("/")) return res.writeHead(404).end();
    try {
      const body = await readFile(join(distDir, file));
      const type = file.endsWith(".html") ? "text/html" : file.endsWith(".js") ? "text/javascript" : "application/octet-stream";
      res.writeHead(200, { "content-type": type }).end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, url: `http://127.0.0.1:${server.address().port}` };
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
