import { FormEvent, useCallback, useEffect, useRef, useState, useSyncExternalStore } from "react";
import type { connect } from "sluice-client";
import { useLiveQuery, useSluice, useTopic } from "sluice-client/react";
import {
  HEARTBEAT_MS,
  PresenceData,
  PresenceState,
  authorOf,
  presentUsers,
  roomTag,
  stateOf,
  userTag,
} from "./presence";
import { forgetToken, saveToken } from "./session";

type Client = ReturnType<typeof connect>;

interface Room {
  id: string;
  name: string;
}
interface Message {
  id: string;
  author: string;
  body: string;
  ts: number; // µs since the epoch
}

/** The shortest time between two presence records of this page, but for `join` and `leave`. */
const ANSWER_INTERVAL_MS = 1000;
/** The most messages a room shows (the newest ones). */
const MESSAGES_SHOWN_MAX = 200;

/** The room named by the address's `#room`, if any. */
function roomInHash(): string | null {
  try {
    return decodeURIComponent(location.hash.slice(1)) || null;
  } catch {
    return null; // a malformed escape: no room chosen
  }
}

export function App({ client, me }: { client: Client; me: string | null }) {
  const onStatus = useCallback((onChange: () => void) => client.onStatus(onChange), [client]);
  const connection = useSyncExternalStore(onStatus, () => client.status);
  // Only the rooms this user belongs to: the `member_rooms` policy filters them on the server.
  const rooms = useLiveQuery<Room>("SELECT id, name FROM rooms ORDER BY name");
  const [chosen, setChosen] = useState<string | null>(roomInHash);
  const room = rooms.rows.some((r) => r.id === chosen) ? chosen : (rooms.rows[0]?.id ?? null);

  function choose(id: string) {
    setChosen(id);
    history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  }

  return (
    <div className="app">
      <header>
        <strong>Sluice chat</strong>
        <span data-testid="me">{me ?? "(no client token)"}</span>
        <span className="spacer" />
        <span className={`badge ${connection}`} data-testid="connection">
          {connection}
        </span>
        <button
          onClick={() => {
            forgetToken();
            location.reload();
          }}
        >
          Sign out
        </button>
      </header>
      <nav data-testid="rooms" data-status={rooms.status}>
        <h2>Rooms</h2>
        {rooms.rows.map((r) => (
          <button key={r.id} data-room={r.id} aria-current={r.id === room} onClick={() => choose(r.id)}>
            # {r.name}
          </button>
        ))}
        {rooms.status === "live" && rooms.rows.length === 0 && <p className="empty">You are in no room yet.</p>}
        {rooms.error && <p className="error">{rooms.error.message}</p>}
      </nav>
      {room === null ? (
        <main />
      ) : (
        <>
          <Messages room={room} />
          {me !== null && <Presence key={room} room={room} me={me} />}
        </>
      )}
    </div>
  );
}

function Messages({ room }: { room: string }) {
  const db = useSluice();
  // The `member_reads` policy adds "room IN (SELECT room FROM members WHERE user_id = auth.sub)"
  // to this query on the server: asking for a room one is not in returns nothing.
  const messages = useLiveQuery<Message>(
    `SELECT id, author, body, ts FROM messages WHERE room = $1 ORDER BY ts DESC, id DESC LIMIT ${MESSAGES_SHOWN_MAX}`,
    [room],
  );
  const [draft, setDraft] = useState("");
  const [sendError, setSendError] = useState<string | null>(null);
  const list = useRef<HTMLUListElement>(null);
  const oldestFirst = [...messages.rows].reverse();

  useEffect(() => {
    const el = list.current;
    if (el) el.scrollTop = el.scrollHeight;
  }, [messages.rows]);

  async function send(e: FormEvent) {
    e.preventDefault();
    const body = draft.trim();
    if (body === "") return;
    setSendError(null);
    try {
      // Clients cannot insert into `messages` (no INSERT policy): the `send` function checks
      // membership and writes author and time itself (functions.js).
      await db.call("send", { room, body });
      setDraft("");
    } catch (err) {
      setSendError(err instanceof Error ? err.message : String(err));
    }
  }

  return (
    <main data-testid="room" data-room={room}>
      <ul
        ref={list}
        data-testid="messages"
        data-status={messages.status}
        className={messages.status === "loading" ? "loading" : ""}
      >
        {oldestFirst.map((m) => (
          <li key={m.id} data-id={m.id} data-author={m.author}>
            <time>{new Date(m.ts / 1000).toLocaleTimeString()}</time>
            <span className="author">{m.author}</span>
            <span className="body">{m.body}</span>
          </li>
        ))}
      </ul>
      {messages.error && <p className="error">{messages.error.message}</p>}
      {sendError && (
        <p className="error" data-testid="send-error">
          {sendError}
        </p>
      )}
      <form onSubmit={send}>
        <input
          data-testid="composer"
          value={draft}
          onChange={(e) => setDraft(e.target.value)}
          placeholder={`Message #${room}`}
          maxLength={2000}
        />
        <button type="submit" data-testid="send">
          Send
        </button>
      </form>
    </main>
  );
}

function Presence({ room, me }: { room: string; me: string }) {
  const db = useSluice();
  const topic = useTopic<PresenceData>("presence", { tags: [roomTag(room)] });
  const [, tick] = useState(0);
  const newest = useRef<{ ts: number; seenAt: number } | null>(null);
  const answered = useRef(-1);
  const lastSent = useRef(0);
  const answerTimer = useRef<ReturnType<typeof setTimeout> | null>(null);

  const live = topic.status === "live";

  const announce = useCallback(
    (state: PresenceState) => {
      lastSent.current = Date.now();
      db.append("presence", [{ tags: [roomTag(room), userTag(me)], data: { user: me, state } }], {
        durability: "memory",
      }).catch((err: unknown) => console.warn("presence:", err));
    },
    [db, room, me],
  );

  // Announce ourselves once the watch is live (so we see the answers), heartbeat, and leave.
  useEffect(() => {
    if (!live) return;
    announce("join");
    const heartbeat = setInterval(() => announce("here"), HEARTBEAT_MS);
    const redraw = setInterval(() => tick((n) => n + 1), HEARTBEAT_MS / 2);
    const leave = () => announce("leave");
    addEventListener("pagehide", leave);
    return () => {
      clearInterval(heartbeat);
      clearInterval(redraw);
      if (answerTimer.current !== null) clearTimeout(answerTimer.current);
      answerTimer.current = null;
      removeEventListener("pagehide", leave);
      leave();
    };
  }, [announce, live]);

  // Answer a newcomer's `join` with a `here` so it sees us at once — at most one record a
  // second: joins that come faster share one (deferred) answer.
  useEffect(() => {
    for (const record of topic.records) {
      if (record.offset <= answered.current) continue;
      answered.current = record.offset;
      if (!live || authorOf(record) === me || stateOf(record) !== "join" || answerTimer.current !== null) continue;
      const wait = Math.max(0, lastSent.current + ANSWER_INTERVAL_MS - Date.now());
      answerTimer.current = setTimeout(() => {
        answerTimer.current = null;
        announce("here");
      }, wait);
    }
  }, [topic.records, announce, live, me]);

  // The server's clock, estimated from the newest record seen and the local time since it
  // arrived: staleness does not depend on the two clocks agreeing.
  const newestTs = topic.records.reduce((max, r) => Math.max(max, r.ts), 0);
  if (newest.current === null || newestTs > newest.current.ts) newest.current = { ts: newestTs, seenAt: Date.now() };
  const nowUs = newest.current.ts + (Date.now() - newest.current.seenAt) * 1000;
  const users = presentUsers(topic.records, room, nowUs);

  return (
    <aside data-testid="presence" data-status={topic.status}>
      <h2>Here now</h2>
      <ul>
        {users.map((u) => (
          <li key={u} data-user={u}>
            {u}
            {u === me ? " (you)" : ""}
          </li>
        ))}
      </ul>
    </aside>
  );
}

export function SignIn() {
  const [token, setToken] = useState("");
  return (
    <form
      className="signin"
      onSubmit={(e) => {
        e.preventDefault();
        saveToken(token);
        location.reload();
      }}
    >
      <h1>Sluice chat</h1>
      <p>
        Paste a client token (<code>sluice token --secret … --sub alice</code>), or open this page with{" "}
        <code>?token=…</code>.
      </p>
      <textarea value={token} onChange={(e) => setToken(e.target.value)} data-testid="token" />
      <button type="submit">Sign in</button>
    </form>
  );
}
