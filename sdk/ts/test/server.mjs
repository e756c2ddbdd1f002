// Starts a real `sluice serve` for a test: fresh data dir, loopback, chosen admin token.
// Kill/restart keep the data dir and the port (for the crash and token tests).

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import WebSocket from "ws";
import { connect } from "../dist/index.js";

const here = dirname(fileURLToPath(import.meta.url));
export const BIN = process.env.SLUICE_BIN ? resolve(process.env.SLUICE_BIN) : resolve(here, "../../../target/debug/sluice");
export const ADMIN = "admin-token-for-sdk-tests";

// Servers and data dirs still around when the test process ends (a failed or killed test) are
// cleaned up here: never leave a `sluice serve` behind.
const live = new Set();
process.on("exit", () => {
  for (const s of live) {
    s.proc?.kill("SIGKILL");
    rmSync(s.dir, { recursive: true, force: true });
  }
});
for (const sig of ["SIGINT", "SIGTERM"]) process.once(sig, () => process.exit(130));

export class Server {
  constructor({ jwtSecret, extraArgs = [], durability = "memory" } = {}) {
    this.durability = durability;
    this.dir = mkdtempSync(join(tmpdir(), "sluice-sdk-"));
    this.jwtSecret = jwtSecret;
    this.extraArgs = extraArgs;
    this.port = 0;
    this.proc = null;
    live.add(this);
  }

  async start() {
    const args = ["serve", "--data", join(this.dir, "data"), "--listen", `127.0.0.1:${this.port}`, "--admin-token", ADMIN, "--durability", this.durability, ...this.extraArgs];
    if (this.jwtSecret) args.push("--jwt-secret", this.jwtSecret);
    const proc = spawn(BIN, args, { stdio: ["ignore", "ignore", "pipe"] });
    this.proc = proc;
    let log = "";
    const addr = await new Promise((res, rej) => {
      const timer = setTimeout(() => rej(new Error(`sluice did not say "listening" within 20 s:\n${log}`)), 20_000);
      proc.stderr.on("data", (d) => {
        log += d;
        const m = /listening on http:\/\/([\d.]+:(\d+))/.exec(log);
        if (m) {
          clearTimeout(timer);
          res(m);
        }
      });
      proc.on("error", (e) => {
        clearTimeout(timer);
        rej(new Error(`cannot run ${BIN} (set SLUICE_BIN): ${e.message}`));
      });
      proc.on("exit", (code) => {
        clearTimeout(timer);
        rej(new Error(`sluice exited with ${code}:\n${log}`));
      });
    }).catch(async (e) => {
      // The port may still be held right after a kill: try again a few times.
      if (this.port && (this.retries = (this.retries ?? 0) + 1) < 20 && /in use|bind/i.test(e.message)) {
        await new Promise((r) => setTimeout(r, 250));
        return null;
      }
      throw e;
    });
    if (addr === null) return this.start();
    this.retries = 0;
    this.port = Number(addr[2]);
    this.url = `http://127.0.0.1:${this.port}`;
    proc.stderr.removeAllListeners("data");
    proc.stderr.resume();
    return this;
  }

  /** kill -9: no graceful shutdown, connections drop. */
  async kill9() {
    const p = this.proc;
    if (!p || p.exitCode !== null) return;
    const exited = new Promise((r) => p.on("exit", r));
    p.kill("SIGKILL");
    await exited;
    this.proc = null;
  }

  async stop() {
    await this.kill9();
    rmSync(this.dir, { recursive: true, force: true });
    live.delete(this);
  }

  token(sub, { ttl = "1h", claims = {} } = {}) {
    const args = ["token", "--secret", this.jwtSecret, "--sub", sub, "--ttl", ttl];
    for (const [k, v] of Object.entries(claims)) args.push("--claim", `${k}=${JSON.stringify(v)}`);
    return execFileSync(BIN, args, { encoding: "utf8" }).trim();
  }

  client(opts = {}) {
    return connect({ url: this.url, token: ADMIN, WebSocket, reconnect: { initialDelayMs: 50, maxDelayMs: 500 }, ...opts });
  }

  async http(method, path, body, token = ADMIN) {
    const res = await fetch(`${this.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body !== undefined ? { "content-type": "application/json" } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  async sql(sql, params, token = ADMIN) {
    const res = await fetch(`${this.url}/v1/sql`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ sql, params }),
    });
    const body = await res.json();
    if (!res.ok) throw new Error(`${sql}: ${JSON.stringify(body)}`);
    return body;
  }
}

/** Resolves when `pred()` holds (checked on every change of `obj` and every 20 ms), or fails after `ms`. */
export function until(pred, what, ms = 15_000) {
  return new Promise((res, rej) => {
    const t0 = Date.now();
    const tick = () => {
      let ok = false;
      try {
        ok = pred();
      } catch (e) {
        return rej(e);
      }
      if (ok) return res();
      if (Date.now() - t0 > ms) return rej(new Error(`timed out after ${ms} ms waiting for ${what}`));
      setTimeout(tick, 20);
    };
    tick();
  });
}

/** A small seeded PRNG (mulberry32). */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
