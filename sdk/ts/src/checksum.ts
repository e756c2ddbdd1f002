// The view checksum of docs/protocol.md ("Checksum"): the wrapping 64-bit sum of
// XXH3-64(canonical row bytes) over the rows a client holds, as 16 hex digits.

import { createXXHash3, type IHasher } from "hash-wasm";
import { Float, OMap } from "./wire.js";
import { unbase64 } from "./json.js";

let hasher: IHasher | null = null;
let loading: Promise<void> | null = null;

/** Loads the XXH3 implementation (WebAssembly); resolves once `rowHash` can be called. */
export function loadChecksum(): Promise<void> {
  if (hasher) return Promise.resolve();
  if (!loading)
    loading = createXXHash3(0, 0).then((h) => {
      hasher = h;
    });
  return loading;
}

export const MASK = (1n << 64n) - 1n;

/** XXH3-64 (seed 0) of `bytes` as an unsigned bigint. */
export function xxh3(bytes: Uint8Array): bigint {
  if (!hasher) throw new Error("sluice-client: checksum not loaded (await loadChecksum())");
  hasher.init();
  hasher.update(bytes);
  const d = hasher.digest("binary"); // the canonical (big-endian) form
  return (BigInt(((d[0] << 24) | (d[1] << 16) | (d[2] << 8) | d[3]) >>> 0) << 32n) | BigInt(((d[4] << 24) | (d[5] << 16) | (d[6] << 8) | d[7]) >>> 0);
}

export function render(sum: bigint): string {
  return (sum & MASK).toString(16).padStart(16, "0");
}

const utf8 = new TextEncoder();

class Bytes {
  buf = new Uint8Array(128);
  view = new DataView(this.buf.buffer);
  len = 0;
  reset() {
    this.len = 0;
  }
  ensure(n: number) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(b: number) {
    this.ensure(1);
    this.buf[this.len++] = b;
  }
  i64(v: number | bigint) {
    this.ensure(8);
    this.view.setBigInt64(this.len, BigInt.asIntN(64, BigInt(v)), true);
    this.len += 8;
  }
  f64(v: number) {
    this.ensure(8);
    this.view.setFloat64(this.len, v, true);
    this.len += 8;
  }
  var(tag: number, b: Uint8Array) {
    this.ensure(5 + b.length);
    this.buf[this.len++] = tag;
    this.view.setUint32(this.len, b.length, true);
    this.len += 4;
    this.buf.set(b, this.len);
    this.len += b.length;
  }
}

const scratch = new Bytes();

function isInt(v: unknown): v is number | bigint {
  return typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v));
}

/** Appends one value's canonical bytes; `type` is the column's declared type or null. */
function putValue(out: Bytes, type: string | null, v: unknown): void {
  if (v === null || v === undefined) return out.u8(0x00);
  switch (type) {
    case "integer":
      if (isInt(v)) return (out.u8(0x01), out.i64(v));
      break;
    case "timestamp":
      if (isInt(v)) return (out.u8(0x07), out.i64(v));
      break;
    case "real":
      if (v instanceof Float) return (out.u8(0x02), out.f64(v.value));
      if (typeof v === "number") return (out.u8(0x02), out.f64(v));
      break;
    case "boolean":
      if (typeof v === "boolean") return (out.u8(0x03), out.u8(v ? 1 : 0));
      break;
    case "text":
      if (typeof v === "string") return out.var(0x04, utf8.encode(v));
      break;
    case "blob":
      if (v instanceof Uint8Array) return out.var(0x05, v);
      if (typeof v === "string") return out.var(0x05, unbase64(v));
      break;
    case "json":
      return out.var(0x06, utf8.encode(canonicalJson(v)));
  }
  // No declared type (or a value that does not fit it): the value says its own type.
  if (typeof v === "boolean") return (out.u8(0x03), out.u8(v ? 1 : 0));
  if (v instanceof Float) return (out.u8(0x02), out.f64(v.value));
  if (isInt(v)) return (out.u8(0x01), out.i64(v));
  if (typeof v === "number") return (out.u8(0x02), out.f64(v));
  if (typeof v === "string") return out.var(0x04, utf8.encode(v));
  if (v instanceof Uint8Array) return out.var(0x05, v);
  return out.var(0x06, utf8.encode(canonicalJson(v)));
}

/** The canonical bytes of a decoded (wire) row: `row` is an OMap or a plain object. */
export function canonicalBytes(row: unknown, columns: string[], types: (string | null)[]): Uint8Array {
  scratch.reset();
  for (let i = 0; i < columns.length; i++) {
    const v = row instanceof OMap ? row.get(columns[i]) : (row as Record<string, unknown>)[columns[i]];
    putValue(scratch, types[i] ?? null, v);
  }
  return scratch.buf.subarray(0, scratch.len);
}

/** The hash of one decoded (wire) row. */
export function rowHash(row: unknown, columns: string[], types: (string | null)[]): bigint {
  return xxh3(canonicalBytes(row, columns, types));
}

/** Compact JSON text as serde_json prints it: keys in wire order, floats as ryu prints them. */
export function canonicalJson(v: unknown): string {
  if (v === null || v === undefined) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (v instanceof Float) return formatFloat(v.value);
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : formatFloat(v);
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(canonicalJson).join(",") + "]";
  if (v instanceof OMap) {
    let s = "{";
    for (let i = 0; i < v.keys.length; i++) {
      if (i) s += ",";
      s += JSON.stringify(v.keys[i]) + ":" + canonicalJson(v.values[i]);
    }
    return s + "}";
  }
  if (typeof v === "object")
    return "{" + Object.entries(v as object).map(([k, x]) => JSON.stringify(k) + ":" + canonicalJson(x)).join(",") + "}";
  return "null";
}

/**
 * An f64 as serde_json 1.0.154 prints it (the `zmij` crate): shortest round-trip digits; fixed
 * notation when the decimal exponent is in -5..=15 (`1.0`, `12.5`, `0.00001`,
 * `1000000000000000.0`), otherwise `1e+16`, `1.5e-7`.
 */
export function formatFloat(x: number): string {
  if (!Number.isFinite(x)) return "null";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mant, exp] = Math.abs(x).toExponential().split("e");
  const digits = mant.replace(".", "");
  const length = digits.length;
  const e = Number(exp); // |x| = d.ddd × 10^e
  let s: string;
  if (e >= -5 && e <= 15) {
    if (length - 1 <= e) s = digits + "0".repeat(e - (length - 1)) + ".0";
    else if (e >= 0) s = digits.slice(0, e + 1) + "." + digits.slice(e + 1);
    else s = "0." + "0".repeat(-e - 1) + digits;
  } else {
    s = (length > 1 ? digits[0] + "." + digits.slice(1) : digits) + "e" + (e >= 0 ? "+" : "-") + Math.abs(e);
  }
  return sign + s;
}
