// A small MessagePack encoder and a decoder that keeps integers apart from floats
// (see wire.ts). Maps decode to `OMap`, floats to `Float`, integers beyond 2^53 to `bigint`,
// `bin` to `Uint8Array`; extension types are refused.

import { Float, OMap } from "./wire.js";
import { SluiceError } from "./errors.js";
import { base64 } from "./json.js";

const utf8e = new TextEncoder();
const utf8d = new TextDecoder("utf-8", { fatal: false });

/** Nesting a request may have (objects and arrays, the message itself included); below the server's 128. */
export const MAX_DEPTH = 100;

export function encode(value: unknown): Uint8Array {
  const out = new Writer();
  write(out, value, 0);
  return out.finish();
}

class Writer {
  buf = new Uint8Array(256);
  view = new DataView(this.buf.buffer);
  len = 0;
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
  u16(n: number) {
    this.ensure(2);
    this.view.setUint16(this.len, n);
    this.len += 2;
  }
  u32(n: number) {
    this.ensure(4);
    this.view.setUint32(this.len, n);
    this.len += 4;
  }
  bytes(b: Uint8Array) {
    this.ensure(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }
  finish() {
    return this.buf.slice(0, this.len);
  }
}

function write(w: Writer, v: unknown, depth: number): void {
  if (depth > MAX_DEPTH) throw new SluiceError("bad_request", `a message nested deeper than ${MAX_DEPTH} levels (the server allows 128)`);
  if (v === null || v === undefined) return w.u8(0xc0);
  if (v === false) return w.u8(0xc2);
  if (v === true) return w.u8(0xc3);
  if (v instanceof Float) return writeFloat(w, finite(v.value));
  if (typeof v === "number") {
    if (Number.isSafeInteger(v) && !Object.is(v, -0)) return writeInt(w, BigInt(v), v);
    return writeFloat(w, finite(v));
  }
  if (typeof v === "bigint") return writeInt(w, v, Number(v));
  if (typeof v === "string") {
    const b = utf8e.encode(v);
    if (b.length < 32) w.u8(0xa0 | b.length);
    else if (b.length < 0x100) (w.u8(0xd9), w.u8(b.length));
    else if (b.length < 0x10000) (w.u8(0xda), w.u16(b.length));
    else (w.u8(0xdb), w.u32(b.length));
    return w.bytes(b);
  }
  // BLOB values travel as base64 text, as over JSON (the server reads MessagePack into JSON
  // values, which have no bytes).
  if (v instanceof Uint8Array) return write(w, base64(v), depth);
  if (Array.isArray(v)) {
    const n = v.length;
    if (n < 16) w.u8(0x90 | n);
    else if (n < 0x10000) (w.u8(0xdc), w.u16(n));
    else (w.u8(0xdd), w.u32(n));
    for (const x of v) write(w, x, depth + 1);
    return;
  }
  if (v instanceof OMap) {
    header(w, v.keys.length);
    v.keys.forEach((k, i) => (write(w, k, depth + 1), write(w, v.values[i], depth + 1)));
    return;
  }
  if (typeof v === "object") {
    const entries = Object.entries(v as Record<string, unknown>).filter(([, x]) => x !== undefined);
    header(w, entries.length);
    for (const [k, x] of entries) (write(w, k, depth + 1), write(w, x, depth + 1));
    return;
  }
  throw new SluiceError("bad_request", `cannot encode a value of type ${typeof v}`);
}

function finite(f: number): number {
  if (!Number.isFinite(f)) throw new SluiceError("bad_request", `${f} cannot be sent: values must be finite numbers`);
  return f;
}

function header(w: Writer, n: number) {
  if (n < 16) w.u8(0x80 | n);
  else if (n < 0x10000) (w.u8(0xde), w.u16(n));
  else (w.u8(0xdf), w.u32(n));
}

function writeFloat(w: Writer, f: number) {
  w.u8(0xcb);
  w.ensure(8);
  w.view.setFloat64(w.len, f);
  w.len += 8;
}

function writeInt(w: Writer, i: bigint, n: number) {
  if (i >= 0n) {
    if (i < 128n) return w.u8(n);
    if (i < 0x100n) return (w.u8(0xcc), w.u8(n));
    if (i < 0x10000n) return (w.u8(0xcd), w.u16(n));
    if (i < 0x100000000n) return (w.u8(0xce), w.u32(n));
    if (i >= 1n << 64n) throw new SluiceError("bad_request", `integer ${i} does not fit in 64 bits`);
    w.u8(0xcf);
    w.ensure(8);
    w.view.setBigUint64(w.len, i);
    w.len += 8;
    return;
  }
  if (i >= -32n) return w.u8(0xe0 | (n + 32));
  if (i >= -128n) return (w.u8(0xd0), w.u8(n & 0xff));
  if (i >= -32768n) return (w.u8(0xd1), w.u16(n & 0xffff));
  if (i >= -2147483648n) return (w.u8(0xd2), w.u32(n >>> 0));
  if (i < -(1n << 63n)) throw new SluiceError("bad_request", `integer ${i} does not fit in 64 bits`);
  w.u8(0xd3);
  w.ensure(8);
  w.view.setBigInt64(w.len, i);
  w.len += 8;
}

function protocol(msg: string): SluiceError {
  return new SluiceError("protocol", `bad MessagePack from the server: ${msg}`);
}

export function decode(bytes: Uint8Array): unknown {
  const r = new Reader(bytes);
  const v = r.value(0);
  if (r.pos !== bytes.length) throw protocol("trailing bytes");
  return v;
}

class Reader {
  view: DataView;
  pos = 0;
  constructor(readonly b: Uint8Array) {
    this.view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  }
  need(n: number) {
    if (this.pos + n > this.b.length) throw protocol("truncated");
  }
  u8() {
    this.need(1);
    return this.b[this.pos++];
  }
  u16() {
    this.need(2);
    const v = this.view.getUint16(this.pos);
    this.pos += 2;
    return v;
  }
  u32() {
    this.need(4);
    const v = this.view.getUint32(this.pos);
    this.pos += 4;
    return v;
  }
  int(big: bigint): number | bigint {
    return big >= -9007199254740991n && big <= 9007199254740991n ? Number(big) : big;
  }
  str(n: number) {
    this.need(n);
    const b = this.b;
    const start = this.pos;
    this.pos += n;
    if (n < 64) {
      // Short ASCII strings (most keys and values): faster than TextDecoder.
      let s = "";
      for (let i = start; i < start + n; i++) {
        const c = b[i];
        if (c >= 0x80) return utf8d.decode(b.subarray(start, start + n));
        s += String.fromCharCode(c);
      }
      return s;
    }
    return utf8d.decode(b.subarray(start, start + n));
  }
  bin(n: number) {
    this.need(n);
    const s = this.b.slice(this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
  array(n: number, depth: number) {
    const a = new Array(n);
    for (let i = 0; i < n; i++) a[i] = this.value(depth + 1);
    return a;
  }
  map(n: number, depth: number) {
    const keys: string[] = new Array(n);
    const values: unknown[] = new Array(n);
    for (let i = 0; i < n; i++) {
      const k = this.value(depth + 1);
      keys[i] = typeof k === "string" ? k : String(k);
      values[i] = this.value(depth + 1);
    }
    return new OMap(keys, values);
  }
  value(depth: number): unknown {
    if (depth > 512) throw protocol("nested too deep");
    const t = this.u8();
    if (t < 0x80) return t;
    if (t < 0x90) return this.map(t & 0x0f, depth);
    if (t < 0xa0) return this.array(t & 0x0f, depth);
    if (t < 0xc0) return this.str(t & 0x1f);
    if (t >= 0xe0) return t - 0x100;
    switch (t) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        return this.bin(this.u8());
      case 0xc5:
        return this.bin(this.u16());
      case 0xc6:
        return this.bin(this.u32());
      case 0xca: {
        this.need(4);
        const v = this.view.getFloat32(this.pos);
        this.pos += 4;
        return new Float(v);
      }
      case 0xcb: {
        this.need(8);
        const v = this.view.getFloat64(this.pos);
        this.pos += 8;
        return new Float(v);
      }
      case 0xcc:
        return this.u8();
      case 0xcd:
        return this.u16();
      case 0xce:
        return this.u32();
      case 0xcf: {
        this.need(8);
        const v = this.view.getBigUint64(this.pos);
        this.pos += 8;
        return this.int(v);
      }
      case 0xd0: {
        const v = this.u8();
        return v >= 0x80 ? v - 0x100 : v;
      }
      case 0xd1: {
        const v = this.u16();
        return v >= 0x8000 ? v - 0x10000 : v;
      }
      case 0xd2: {
        this.need(4);
        const v = this.view.getInt32(this.pos);
        this.pos += 4;
        return v;
      }
      case 0xd3: {
        this.need(8);
        const v = this.view.getBigInt64(this.pos);
        this.pos += 8;
        return this.int(v);
      }
      case 0xd9:
        return this.str(this.u8());
      case 0xda:
        return this.str(this.u16());
      case 0xdb:
        return this.str(this.u32());
      case 0xdc:
        return this.array(this.u16(), depth);
      case 0xdd:
        return this.array(this.u32(), depth);
      case 0xde:
        return this.map(this.u16(), depth);
      case 0xdf:
        return this.map(this.u32(), depth);
      default:
        throw protocol(`unsupported type byte 0x${t.toString(16)}`);
    }
  }
}
