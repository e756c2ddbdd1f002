#!/usr/bin/env python3
"""A fixed, serial HTTP load for instruction counts of the server (see server_callgrind.sh).

    http_load.py PORT TOKEN mutate FIRST N   # N POST /v1/mutate of 100 `events` rows each
    http_load.py PORT TOKEN call   FIRST N   # N POST /v1/call/transfer over 10 000 accounts

FIRST = 0 also creates the table (and, for `call`, its accounts). One keep-alive connection,
one request at a time: the counts are per request, not a benchmark.
"""
import http.client
import json
import random
import sys

TEXT = ("the quick brown fox jumps over the lazy dog while the sluice keeps every write in "
        "order and durable; pack my box with five dozen liquor jugs")


def main():
    port, token, mode, first, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=600)
    headers = {"authorization": "Bearer " + token, "content-type": "application/json"}

    def post(path, body):
        conn.request("POST", path, body, headers)
        reply = conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            sys.exit(f"{path}: {reply.status} {data[:300]!r}")
        return data

    if mode == "mutate":
        if first == 0:
            post("/v1/sql", json.dumps({"sql": "CREATE TABLE events (id INTEGER PRIMARY KEY, "
                                        "room TEXT NOT NULL, author TEXT, body TEXT, ts INTEGER)"}))
        bodies = []
        for k in range(first, first + n):
            ops = []
            for i in range(k * 100, k * 100 + 100):
                s = i % 40
                ops.append('{"op":"insert","table":"events","row":{"id":%d,"room":"room-%d",'
                           '"author":"user-%d","body":"%s","ts":%d}}'
                           % (i, i % 1000, i % 10000, TEXT[s:s + 100], 1700000000000000 + i * 1000))
            bodies.append(('{"durability":"disk","ops":[' + ",".join(ops) + "]}").encode())
        path = "/v1/mutate"
    elif mode == "call":
        if first == 0:
            post("/v1/sql", json.dumps({"sql": "CREATE TABLE accounts (id INTEGER PRIMARY KEY, "
                                        "balance INTEGER NOT NULL)"}))
            for k in range(10):
                post("/v1/mutate", json.dumps({"ops": [
                    {"op": "insert", "table": "accounts", "row": {"id": i, "balance": 10**9}}
                    for i in range(k * 1000, (k + 1) * 1000)]}))
        rng = random.Random(first)
        bodies = []
        for _ in range(n):
            a, b = rng.sample(range(10000), 2)
            bodies.append(json.dumps({"args": {"from": a, "to": b, "amount": 1},
                                      "durability": "fsync"}).encode())
        path = "/v1/call/transfer"
    else:
        sys.exit(f"unknown mode {mode}")
    for body in bodies:
        post(path, body)


if __name__ == "__main__":
    main()
