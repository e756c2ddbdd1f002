#!/usr/bin/env python3
"""A fixed, serial HTTP load for instruction counts of the server (see server_callgrind.sh).

    http_load.py PORT TOKEN mutate FIRST N   # N POST /v1/mutate of 100 `events` rows each
    http_load.py PORT TOKEN call   FIRST N   # N POST /v1/call/transfer over 10 000 accounts
    http_load.py PORT TOKEN ws-call   FIRST N  # the same calls over /v1/ws, MessagePack
    http_load.py PORT TOKEN ws-mutate FIRST N  # the same mutates over /v1/ws, MessagePack

FIRST = 0 also creates the table (and, for the calls, its accounts). One keep-alive
connection (or WebSocket), one request at a time: the counts are per request, not a
benchmark.
"""
import base64
import http.client
import json
import os
import random
import socket
import struct
import sys


def msgpack(value):
    """The MessagePack of a JSON-like value (what the TypeScript SDK sends): maps, arrays,
    text, integers of at most 32 bits, booleans and nil."""
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if 0 <= value < 128:
            return bytes([value])
        if 0 <= value < 2**32:
            return b"\xce" + struct.pack(">I", value)
        return b"\xd3" + struct.pack(">q", value)
    if isinstance(value, str):
        raw = value.encode()
        if len(raw) < 32:
            return bytes([0xA0 | len(raw)]) + raw
        return b"\xd9" + bytes([len(raw)]) + raw if len(raw) < 256 else b"\xda" + struct.pack(">H", len(raw)) + raw
    if isinstance(value, list):
        head = bytes([0x90 | len(value)]) if len(value) < 16 else b"\xdc" + struct.pack(">H", len(value))
        return head + b"".join(msgpack(v) for v in value)
    if isinstance(value, dict):
        head = bytes([0x80 | len(value)]) if len(value) < 16 else b"\xde" + struct.pack(">H", len(value))
        return head + b"".join(msgpack(k) + msgpack(v) for k, v in value.items())
    raise TypeError(value)


class WebSocket:
    """A minimal client of /v1/ws: binary frames out (masked), whole frames in."""

    def __init__(self, port, token):
        self.sock = socket.create_connection(("127.0.0.1", int(port)), timeout=600)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: sluice.msgpack.v1\r\n"
                           f"Authorization: Bearer {token}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if not head.startswith(b"HTTP/1.1 101"):
            sys.exit(f"/v1/ws: {head[:200]!r}")

    def _exact(self, n):
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                sys.exit("/v1/ws: closed")
            out += got
        return out

    def send(self, payload):
        mask = os.urandom(4)
        n = len(payload)
        head = b"\x82" + (bytes([0x80 | n]) if n < 126 else
                          bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                          bytes([0x80 | 127]) + struct.pack(">Q", n))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def recv(self):
        b0, b1 = self._exact(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self._exact(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._exact(8))[0]
        return b0 & 0x0F, self._exact(n)

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

    ws = mode.startswith("ws-")
    mode = mode[3:] if ws else mode
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
    if not ws:
        for body in bodies:
            post(path, body)
        return
    # The same requests over one WebSocket, each waited for: a reply is one frame, a
    # refusal is an `error` reply.
    sock = WebSocket(port, token)
    for k, body in enumerate(bodies):
        request = json.loads(body)
        if path == "/v1/mutate":
            request = {"type": "mutate", "id": k, "ops": request["ops"],
                       "durability": request["durability"]}
        else:
            request = {"type": "call", "id": k, "name": "transfer", "args": request["args"],
                       "durability": request["durability"]}
        sock.send(msgpack(request))
        opcode, reply = sock.recv()
        if opcode != 2 or b"error" in reply[:16]:
            sys.exit(f"/v1/ws: {opcode} {reply[:300]!r}")


if __name__ == "__main__":
    main()
