// Codec units (no server): MessagePack round trips keep integers apart from floats, the JSON
// parser keeps number kinds and key order, floats print as serde_json prints them, canonical
// row bytes as crates/live/src/checksum.rs lays them out, XXH3 against a reference vector.

import { test } from "node:test";
import assert from "node:assert/strict";
import { encode, decode } from "../dist/msgpack.js";
import { parseJson, stringifyJson } from "../dist/json.js";
import { Float, OMap, plain } from "../dist/wire.js";
import { loadChecksum, xxh3, canonicalBytes, canonicalJson, formatFloat, render } from "../dist/checksum.js";

test("MessagePack round-trips every kind of value, floats stay floats", () => {
  const values = [0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 32, 2 ** 53 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2 ** 31), -(2 ** 31) - 1, -(2 ** 53) + 1, 2n ** 63n - 1n, -(2n ** 63n), 2n ** 64n - 1n, 1.5, -0.25, 1e300, "", "a".repeat(31), "b".repeat(32), "ü".repeat(200), "c".repeat(70000), true, false, null, [], [1, [2, [3]]], new Array(20).fill(7)];
  for (const v of values) assert.deepEqual(plain(decode(encode(v))), v, `round trip of ${String(v).slice(0, 20)}`);
  assert.ok(decode(encode(1.0)) === 1, "a JS integer-valued number encodes as an integer");
  assert.ok(decode(encode(new Float(1))) instanceof Float, "a Float box encodes as a float");
  assert.ok(decode(encode(-0)) instanceof Float, "-0 is a float");
  const m = decode(encode({ b: 1, a: { c: [1.5] } }));
  assert.ok(m instanceof OMap);
  assert.deepEqual(m.keys, ["b", "a"]);
  assert.deepEqual(plain(m), { b: 1, a: { c: [1.5] } });
  assert.equal(decode(encode(new Uint8Array([0, 1, 255]))), "AAH/", "bytes go as base64 text (BLOB), as over JSON");
  for (const bad of [NaN, Infinity, -Infinity]) {
    assert.throws(() => encode({ x: bad }), (e) => e.code === "bad_request" && /finite/.test(e.message));
    assert.throws(() => stringifyJson({ x: bad }), (e) => e.code === "bad_request" && /finite/.test(e.message));
  }
  let deep = 1;
  for (let i = 0; i < 150; i++) deep = [deep];
  assert.throws(() => encode(deep), (e) => e.code === "bad_request" && /nested deeper/.test(e.message));
  assert.throws(() => stringifyJson(deep), (e) => e.code === "bad_request" && /nested deeper/.test(e.message));
  assert.throws(() => decode(new Uint8Array([0x92, 1])), /truncated/);
  assert.throws(() => decode(new Uint8Array([0xc1])), /unsupported/);
});

test("the JSON parser keeps integer/float and key order; stringify spells bigints exactly", () => {
  const v = parseJson(' {"2": 1, "a": [1.0, 2, -3e2, 9007199254740993, "x\\n\\u00e9"], "b": {"z": null, "y": true}} ');
  assert.ok(v instanceof OMap);
  assert.deepEqual(v.keys, ["2", "a", "b"]);
  const a = v.get("a");
  assert.ok(a[0] instanceof Float && a[0].value === 1);
  assert.equal(a[1], 2);
  assert.ok(a[2] instanceof Float && a[2].value === -300);
  assert.equal(a[3], 9007199254740993n);
  assert.equal(a[4], "x\né");
  assert.equal(canonicalJson(v), '{"2":1,"a":[1.0,2,-300.0,9007199254740993,"x\\né"],"b":{"z":null,"y":true}}');
  assert.equal(stringifyJson({ a: 2n ** 62n, b: [1, "s"] }), '{"a":4611686018427387904,"b":[1,"s"]}');
  for (const bad of ["{", "[1,]", "01", "1.", "nul", '"\\x"', "{} x"]) assert.throws(() => parseJson(bad), /bad JSON/, bad);
});

test("floats print as serde_json prints them", () => {
  const cases = [
    [1, "1.0"], [-0, "-0.0"], [0, "0.0"], [1.5, "1.5"], [0.1, "0.1"], [1e-5, "0.00001"], [1.5e-5, "0.000015"], [1e-6, "1e-6"],
    [2e-7, "2e-7"], [1e15, "1000000000000000.0"], [1e16, "1e+16"], [1.23456e22, "1.23456e+22"], [123456789.125, "123456789.125"],
    [5e-324, "5e-324"], [1.7976931348623157e308, "1.7976931348623157e+308"], [-2.5e-9, "-2.5e-9"], [12345678901234567890, "1.2345678901234567e+19"],
  ];
  for (const [x, want] of cases) assert.equal(formatFloat(x), want, `formatFloat(${x})`);
});

test("canonical row bytes follow the protocol's table; XXH3 matches the reference", async () => {
  await loadChecksum();
  const row = new OMap(["t", "i"], ["ab", -1]);
  assert.deepEqual([...canonicalBytes(row, ["t", "i"], ["text", "integer"])], [4, 2, 0, 0, 0, 97, 98, 1, ...new Array(8).fill(255)]);
  const all = { n: null, i: 1, r: new Float(1), b: true, bl: "AAE=", j: new OMap(["k"], [new Float(2)]), ts: 2 };
  const bytes = [...canonicalBytes(all, Object.keys(all), [null, "integer", "real", "boolean", "blob", "json", "timestamp"])];
  assert.deepEqual(bytes, [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 3, 1, 5, 2, 0, 0, 0, 0, 1, 6, 9, 0, 0, 0, ...Buffer.from('{"k":2.0}'), 7, 2, 0, 0, 0, 0, 0, 0, 0]);
  // Without a declared type a value says its own: a float is REAL even when integral.
  assert.deepEqual([...canonicalBytes({ x: new Float(2) }, ["x"], [null])].slice(0, 1), [2]);
  assert.deepEqual([...canonicalBytes({ x: 2 }, ["x"], [null])].slice(0, 1), [1]);
  assert.equal(render(xxh3(new Uint8Array())), "2d06800538d394c2");
  assert.equal(render(2n ** 64n + 5n), "0000000000000005", "the sum wraps at 2^64");
});
