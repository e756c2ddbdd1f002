import { Server } from "./server.mjs";
const s = await new Server().start();
try {
  for (const encoding of ["msgpack", "json"]) {
    const db = s.client({ encoding });
    await db.sql("CREATE TABLE IF NOT EXISTS b (id INTEGER PRIMARY KEY, x BLOB)");
    try { await db.mutate([{ op: "upsert", table: "b", row: { id: 1, x: new Uint8Array([1, 2, 255]) } }]); console.log(encoding, "ok", (await db.query("SELECT * FROM b")).rows); }
    catch (e) { console.log(encoding, e.code, e.message); }
    db.close();
  }
} finally { await s.stop(); }
