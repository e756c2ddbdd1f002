// Server functions of the chat example: `sluice serve --functions examples/chat/functions.js`
// (or PUT /v1/functions with this file as the body, admin token).
//
// Functions run with full data rights, so each one decides for itself what its caller may do.

const BODY_CHARS_MAX = 2000;

// Which functions a client may call, decided before the call. `allow` sees the caller and the
// arguments but not the data (it gets no `tx`), so it checks the shape here; the membership
// check that needs the data is the first thing `send` does.
export function allow(auth, name, args) {
  return (
    name === "send" &&
    args !== null &&
    typeof args === "object" &&
    typeof args.room === "string" &&
    typeof args.body === "string"
  );
}

// send({room, body}): appends a message to `room` as the caller. The author and the time come
// from the server (tx.auth.sub, tx.now()), never from the client.
export function send(tx, { room, body }) {
  if (tx.auth === null) throw new Error("bad_request: send needs a client token (the message's author)");
  const author = tx.auth.sub;
  if (tx.get("members", room + ":" + author) === null) {
    throw new Error(`forbidden: ${author} is not a member of room ${room}`);
  }
  const text = body.trim();
  if (text.length === 0) throw new Error("bad_request: empty message");
  if (text.length > BODY_CHARS_MAX) {
    throw new Error(`limit: a message has at most ${BODY_CHARS_MAX} characters (got ${text.length})`);
  }
  const ts = tx.now();
  // Unique and time-ordered: µs timestamp (zero-padded so text order is time order) + a
  // deterministic random suffix for two sends in the same µs.
  const id = String(ts).padStart(17, "0") + "-" + Math.floor(tx.random() * 1e9).toString(36);
  tx.insert("messages", { id, room, author, body: text, ts });
  return { id, ts };
}
