// Wire values as decoded before they are handed to the application.
//
// The checksum (docs/protocol.md, "Checksum") needs two facts a plain JavaScript value loses:
// whether a number was sent as an integer or as a float (1 and 1.0), and the order of a JSON
// object's keys (JavaScript moves integer-like keys first). The decoders below therefore
// produce `Float` boxes and `OMap`s; `plain()` turns them into ordinary values afterwards.

/** A number that was a float on the wire (MessagePack float, JSON number with `.` or exponent). */
export class Float {
  constructor(readonly value: number) {}
}

/** A map with its keys in wire order. */
export class OMap {
  constructor(readonly keys: string[], readonly values: unknown[]) {}
  get(key: string): unknown {
    const i = this.keys.indexOf(key);
    return i < 0 ? undefined : this.values[i];
  }
}

/** Turns a decoded wire value into a plain JavaScript value. */
export function plain(v: unknown): unknown {
  if (v instanceof Float) return v.value;
  if (v instanceof OMap) {
    const o: Record<string, unknown> = {};
    for (let i = 0; i < v.keys.length; i++) o[v.keys[i]] = plain(v.values[i]);
    return o;
  }
  if (Array.isArray(v)) return v.map(plain);
  return v;
}

/** A message's top-level fields (a decoded message is always a map). */
export type Wire = OMap;

/** Reads `field` of a decoded message as a plain value. */
export function field(m: Wire, key: string): unknown {
  return plain(m.get(key));
}
