// Shows and parses cell values by column type (docs/api.md, Mutations: INTEGER and TIMESTAMP
// (µs) as JSON integers, REAL as numbers, BOOLEAN as true/false, TEXT as strings, BLOB as
// base64 strings, JSON as any JSON value).

export function show(v: unknown): string {
  if (v === null || v === undefined) return "NULL";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** The text an editor starts from. */
export function draftOf(v: unknown, type: string | null): string {
  if (v === null || v === undefined) return "";
  if (type?.toLowerCase() === "json") return JSON.stringify(v);
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

/** A timestamp (µs since the epoch) as ISO text, for tooltips. */
export function isoOfMicros(v: unknown): string | undefined {
  if (typeof v !== "number" || !Number.isFinite(v)) return undefined;
  const d = new Date(v / 1000);
  return Number.isNaN(d.getTime()) ? undefined : d.toISOString();
}

/** Parses an editor's text for a column of `type`; throws an Error naming what is wrong. */
export function parseValue(text: string, declared: string | null, nullable = true): unknown {
  const type = declared?.toLowerCase() ?? null;
  const t = text.trim();
  if (t === "" && type !== "text" && type !== "blob") {
    if (!nullable) throw new Error("a value is required (NOT NULL)");
    return null;
  }
  switch (type) {
    case "integer": {
      const n = Number(t);
      if (!/^-?\d+$/.test(t) || !Number.isSafeInteger(n)) throw new Error(`not an integer: ${t}`);
      return n;
    }
    case "timestamp": {
      if (/^-?\d+$/.test(t)) {
        const n = Number(t);
        if (!Number.isSafeInteger(n)) throw new Error(`timestamp out of range: ${t}`);
        return n;
      }
      const ms = Date.parse(t);
      if (Number.isNaN(ms)) throw new Error(`not a timestamp (µs or ISO 8601): ${t}`);
      return ms * 1000;
    }
    case "real": {
      const n = Number(t);
      if (!Number.isFinite(n)) throw new Error(`not a number: ${t}`);
      return n;
    }
    case "boolean":
      if (t === "true") return true;
      if (t === "false") return false;
      throw new Error(`not a boolean (true or false): ${t}`);
    case "json":
      try {
        return JSON.parse(t);
      } catch (e) {
        throw new Error(`not JSON: ${(e as Error).message}`);
      }
    default:
      return text;
  }
}

function csvField(v: unknown): string {
  if (v === null || v === undefined) return "";
  const s = typeof v === "object" ? JSON.stringify(v) : String(v);
  return /[",\r\n]/.test(s) || s !== s.trim() ? `"${s.replace(/"/g, '""')}"` : s;
}

/** RFC 4180 CSV: a header line, then one line per row; NULL is an empty field. */
export function toCsv(columns: string[], rows: Record<string, unknown>[]): string {
  const lines = [columns.map(csvField).join(",")];
  for (const r of rows) lines.push(columns.map((c) => csvField(r[c])).join(","));
  return lines.join("\r\n") + "\r\n";
}
