// 1. Live arrays equal one-shot queries after random writes (seeded; both encodings).

import { test } from "node:test";
import assert from "node:assert/strict";
import { Server, rng } from "./server.mjs";
import { convergeTo } from "./helpers.mjs";

const SEED = Number(process.env.SEED ?? Math.floor(Math.random() * 2 ** 31));
const OPS = Number(process.env.SDK_LIVE_OPS ?? 60);


const QUERIES = [
  { label: "filter", sql: "SELECT * FROM items WHERE grp = $1 AND flag", params: [1], ordered: false },
  { label: "top-k", sql: "SELECT id, name, score FROM items ORDER BY score DESC, id LIMIT 5", ordered: true },
  { label: "top-k offset", sql: "SELECT id, score FROM items WHERE grp <> 2 ORDER BY score, id LIMIT 4 OFFSET 2", ordered: true },
  { label: "group by", sql: "SELECT grp, COUNT(*) AS n, SUM(score) AS total FROM items GROUP BY grp", ordered: false },
  { label: "join", sql: "SELECT items.id, items.name, groups.label FROM items JOIN groups ON items.grp = groups.id", ordered: false },
];

for (const encoding of ["msgpack", "json"]) {
  test(`live rows equal one-shot queries after random writes (${encoding}, seed ${SEED})`, { timeout: 60_000 }, async () => {
    console.log(`# live.test seed=${SEED} encoding=${encoding} (reproduce with SEED=${SEED})`);
    const rand = rng(SEED);
    const pick = (n) => Math.floor(rand() * n);
    const server = await new Server().start();
    const db = server.client({ encoding });
    try {
      await db.sql("CREATE TABLE items (id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, score REAL, flag BOOLEAN)");
      await db.sql("CREATE TABLE groups (id INTEGER PRIMARY KEY, label TEXT)");
      await db.mutate([0, 1, 2, 3].map((id) => ({ op: "insert", table: "groups", row: { id, label: `g${id}` } })));
      const lives = QUERIES.map((q) => ({ ...q, live: db.live(q.sql, q.params) }));
      const ids = [];
      let nextId = 1;
      for (let step = 0; step < OPS; step++) {
        const kind = ids.length < 3 ? 0 : pick(10);
        const ops = [];
        if (kind < 4) {
          for (let k = 0, n = 1 + pick(3); k < n; k++) {
            const id = nextId++;
            ids.push(id);
            ops.push({ op: "insert", table: "items", row: { id, grp: pick(4), name: `n${pick(50)}`, score: pick(20) / 2, flag: rand() < 0.6 } });
          }
        } else if (kind < 7) {
          const id = ids[pick(ids.length)];
          const set = [{ score: pick(20) / 2 }, { grp: pick(4) }, { flag: rand() < 0.5 }, { name: `n${pick(50)}` }][pick(4)];
          ops.push({ op: "patch", table: "items", id, set });
        } else if (kind < 9) {
          const i = pick(ids.length);
          ops.push({ op: "delete", table: "items", id: ids[i] });
          ids.splice(i, 1);
        } else {
          ops.push({ op: "patch", table: "groups", id: pick(4), set: { label: `g${pick(100)}` } });
        }
        const { seq } = await db.mutate(ops);
        for (const q of lives) {
          const got = await convergeTo(db, q.live, q.sql, q.params, { ordered: q.ordered, label: `seed ${SEED} step ${step} ${q.label}` });
          assert.ok(got.seq >= seq);
        }
      }
      for (const q of lives) {
        assert.equal(q.live.checksumMismatches, 0, `seed ${SEED}: ${q.label} saw a checksum mismatch`);
        assert.ok(q.live.checksumsVerified > 0, `seed ${SEED}: ${q.label} verified no checksum (does the server send types?)`);
        const seqs = q.live.appliedSeqs;
        for (let i = 1; i < seqs.length; i++) assert.ok(seqs[i] > seqs[i - 1], `seed ${SEED}: ${q.label} applied seq ${seqs[i]} after ${seqs[i - 1]}`);
        q.live.close();
      }
    } finally {
      db.close();
      await server.stop();
    }
  });
}
