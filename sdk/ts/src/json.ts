// A JSON parser that keeps what JSON.parse loses (see wire.ts): a number with `.` or an
// exponent becomes a `Float`, an integer beyond 2^53 a `bigint`, an object an `OMap` with its
// keys in text order. Strings and literals are read by JSON.parse itself.

import { Float, OMap } from "./wire.js";
import { SluiceError } from "./errors.js";

export function parseJson(text: string): unknown {
  const p = new Parser(text);
  p.ws();
  const v = p.value(0);
  p.ws();
  if (p.pos !== text.length) throw p.fail("trailing characters");
  return v;
}

const NUM = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
const STR = /"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/y;

class Parser {
  pos = 0;
  constructor(readonly s: string) {}
  fail(msg: string) {
    return new SluiceError("protocol", `bad JSON from the server at ${this.pos}: ${msg}`);
  }
  ws() {
    const s = this.s;
    while (this.pos < s.length) {
      const c = s.charCodeAt(this.pos);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) this.pos++;
      else break;
    }
  }
  string(): string {
    STR.lastIndex = this.pos;
    const m = STR.exec(this.s);
    if (!m) throw this.fail("bad string");
    this.pos += m[0].length;
    const raw = m[0];
    return raw.indexOf("\\") < 0 ? raw.slice(1, -1) : (JSON.parse(raw) as string);
  }
  value(depth: number): unknown {
    if (depth > 512) throw this.fail("nested too deep");
    const s = this.s;
    const c = s[this.pos];
    if (c === "{") {
      this.pos++;
      const keys: string[] = [];
      const values: unknown[] = [];
      this.ws();
      if (s[this.pos] === "}") {
        this.pos++;
        return new OMap(keys, values);
      }
      for (;;) {
        this.ws();
        if (s[this.pos] !== '"') throw this.fail("expected a key");
        keys.push(this.string());
        this.ws();
        if (s[this.pos++] !== ":") throw this.fail("expected ':'");
        this.ws();
        values.push(this.value(depth + 1));
        this.ws();
        const d = s[this.pos++];
        if (d === "}") return new OMap(keys, values);
        if (d !== ",") throw this.fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      this.pos++;
      const a: unknown[] = [];
      this.ws();
      if (s[this.pos] === "]") {
        this.pos++;
        return a;
      }
      for (;;) {
        this.ws();
        a.push(this.value(depth + 1));
        this.ws();
        const d = s[this.pos++];
        if (d === "]") return a;
        if (d !== ",") throw this.fail("expected ',' or ']'");
      }
    }
    if (c === '"') return this.string();
    if (s.startsWith("true", this.pos)) return (this.pos += 4), true;
    if (s.startsWith("false", this.pos)) return (this.pos += 5), false;
    if (s.startsWith("null", this.pos)) return (this.pos += 4), null;
    NUM.lastIndex = this.pos;
    const m = NUM.exec(s);
    if (!m || m[0] === "-") throw this.fail("unexpected character");
    this.pos += m[0].length;
    if (m[1] !== undefined || m[2] !== undefined) return new Float(Number(m[0]));
    const n = Number(m[0]);
    if (Number.isSafeInteger(n)) return n;
    return BigInt(m[0]);
  }
}

/** JSON text of a plain value for requests (bigint as an integer literal). */
export function stringifyJson(v: unknown): string {
  checkDepth(v, 0);
  return JSON.stringify(v, (_k, x) => {
    if (typeof x === "bigint") return RAW_PREFIX + x.toString();
    if (x instanceof Uint8Array) return base64(x);
    if (typeof x === "number" && !Number.isFinite(x))
      throw new SluiceError("bad_request", `${x} cannot be sent: values must be finite numbers`);
    return x;
  }).replace(
    RAW_RE,
    (_m, d: string) => d,
  );
}
/** Same bound as the MessagePack encoder's (msgpack.ts MAX_DEPTH). */
function checkDepth(v: unknown, depth: number): void {
  if (v === null || typeof v !== "object" || v instanceof Uint8Array) return;
  if (depth > 100) throw new SluiceError("bad_request", "a message nested deeper than 100 levels (the server allows 128)");
  if (Array.isArray(v)) for (const x of v) checkDepth(x, depth + 1);
  else for (const x of Object.values(v)) checkDepth(x, depth + 1);
}

const RAW_PREFIX = "\u0000bigint:";
const RAW_RE = /"\\u0000bigint:(-?\d+)"/g;

export function base64(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i++) s += String.fromCharCode(b[i]);
  return btoa(s);
}

export function unbase64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
