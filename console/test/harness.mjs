// Test harness: a real `sluice serve` on loopback, and — only for servers that do not serve
// the console yet (404 at /console/) — a tiny static server + proxy that serves the built
// assets at /console/ and forwards everything else to sluice, so the page and the API share
// one origin as they do when the binary embeds the console.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, existsSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = join(here, "..", "..");
export const assetsDir = join(repoRoot, "crates", "server", "assets", "console");

export function sluiceBin() {
  const bin = process.env.SLUICE_BIN || join(repoRoot, "target", "debug", "sluice");
  if (!existsSync(bin)) throw new Error(`no sluice binary at ${bin}: build it or set SLUICE_BIN`);
  return bin;
}

/** Starts `sluice serve` on 127.0.0.1:0; resolves once it logs its address. */
export async function startServer(adminToken, extraArgs = []) {
  const data = mkdtempSync(join(tmpdir(), "sluice-console-"));
  const child = spawn(
    sluiceBin(),
    ["serve", "--data", data, "--listen", "127.0.0.1:0", "--admin-token", adminToken, ...extraArgs],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let log = "";
  const url = await new Promise((resolve, reject) => {
    child.on("error", (e) => reject(new Error(`cannot start ${sluiceBin()}: ${e.message}`)));
    const timer = setTimeout(() => reject(new Error(`sluice did not report its address in 20 s; log:\n${log}`)), 20_000);
    const onData = (chunk) => {
      log += chunk;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`sluice exited with ${code} before listening; log:\n${log}`));
    });
  }).catch((e) => {
    // Never leave a server or its data directory behind when it did not start.
    if (child.exitCode === null) child.kill("SIGKILL");
    rmSync(data, { recursive: true, force: true });
    throw e;
  });
  return {
    url,
    data,
    log: () => log,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const t = setTimeout(() => child.kill("SIGKILL"), 8_000);
        await exited;
        clearTimeout(t);
      }
      rmSync(data, { recursive: true, force: true });
    },
  };
}

const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8" };

/** Serves the built console at /console/ and proxies every other path to `target`. */
export async function startProxy(target) {
  const t = new URL(target);
  const server = http.createServer((req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    if (path === "/console" || path.startsWith("/console/")) {
      const rel = normalize(path.slice("/console/".length) || "index.html");
      const file = join(assetsDir, rel === "." || rel === "" ? "index.html" : rel);
      if (!file.startsWith(assetsDir) || !existsSync(file)) {
        res.writeHead(404).end("not found");
        return;
      }
      const ext = file.slice(file.lastIndexOf("."));
      res.writeHead(200, { "Content-Type": TYPES[ext] ?? "application/octet-stream", "Cache-Control": "no-cache" });
      res.end(readFileSync(file));
      return;
    }
    const up = http.request(
      { host: t.hostname, port: t.port, method: req.method, path: req.url, headers: { ...req.headers, host: t.host } },
      (ur) => {
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        res.flushHeaders();
        ur.pipe(res);
        res.on("close", () => ur.destroy()); // the browser went away: close the upstream stream too
      },
    );
    up.on("error", (e) => {
      if (!res.headersSent) res.writeHead(502);
      res.end(String(e));
    });
    req.pipe(up);
  });
  // WebSocket upgrades (/v1/ws, used by the SDK): replay the request to sluice over a raw
  // TCP connection and splice the two sockets.
  const sockets = new Set();
  server.on("upgrade", (req, socket, head) => {
    const up = net.connect(Number(t.port), t.hostname, () => {
      const lines = [`${req.method} ${req.url} HTTP/1.1`];
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        const name = req.rawHeaders[i];
        lines.push(`${name}: ${name.toLowerCase() === "host" ? t.host : req.rawHeaders[i + 1]}`);
      }
      up.write(lines.join("\r\n") + "\r\n\r\n");
      if (head?.length) up.write(head);
      up.pipe(socket);
      socket.pipe(up);
    });
    sockets.add(up).add(socket);
    const end = () => {
      up.destroy();
      socket.destroy();
    };
    up.on("error", end).on("close", end);
    socket.on("error", end).on("close", end);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    stop: () =>
      new Promise((r) => {
        server.closeAllConnections?.();
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** JSON over HTTP with the given token; throws with the server's error on non-2xx. */
export async function api(base, token, method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  const json = text ? JSON.parse(text) : null;
  if (!res.ok) {
    const e = new Error(`${method} ${path} → ${res.status} ${text}`);
    e.status = res.status;
    e.body = json;
    throw e;
  }
  return json;
}
