// Presence through the `presence` topic. Each page appends records tagged
// `room:<id>` and `user:<sub>` — `join` when it opens a room, `here` every HEARTBEAT_MS and in
// answer to someone else's `join` (so a newcomer learns at once who is already there), `leave`
// when it closes the room — and watches its room's tag.
//
// Who a record is from is read from its `user:` tag, never from `data`: the topic's append
// rules (setup.mjs) only let a user append under its own `user:{auth.sub}` tag, so the tag is
// the one thing the server vouches for.

export type PresenceState = "join" | "here" | "leave";
export interface PresenceData {
  user: string;
  state: PresenceState;
}

export interface PresenceRecord {
  offset: number;
  ts: number; // µs since the epoch, the server's clock
  tags: string[];
  data: unknown;
}

export const HEARTBEAT_MS = 10_000;
/** A user with no record for this long is gone (a closed laptop sends no `leave`). */
export const STALE_AFTER_MS = 3 * HEARTBEAT_MS + 5_000;

export function roomTag(room: string): string {
  return `room:${room}`;
}
export function userTag(user: string): string {
  return `user:${user}`;
}

/** The record's author: its single `user:` tag, or null (then the record is ignored). */
export function authorOf(record: PresenceRecord): string | null {
  const users = record.tags.filter((t) => t.startsWith("user:"));
  return users.length === 1 ? users[0].slice("user:".length) : null;
}

export function stateOf(record: PresenceRecord): PresenceState | null {
  const data = record.data as Partial<PresenceData> | null;
  const state = data && typeof data === "object" ? data.state : undefined;
  return state === "join" || state === "here" || state === "leave" ? state : null;
}

/**
 * Users present in `room` given the records seen (in offset order): those whose latest record
 * is not a `leave` and is at most STALE_AFTER_MS older than `nowUs` (the server's clock, as
 * estimated by the caller from the newest record). Sorted by name.
 */
export function presentUsers(records: readonly PresenceRecord[], room: string, nowUs: number): string[] {
  const tag = roomTag(room);
  const latest = new Map<string, { state: PresenceState; ts: number }>();
  for (const record of records) {
    if (!record.tags.includes(tag)) continue;
    const user = authorOf(record);
    const state = stateOf(record);
    if (user === null || state === null) continue;
    latest.set(user, { state, ts: record.ts });
  }
  const present: string[] = [];
  for (const [user, { state, ts }] of latest) {
    if (state !== "leave" && nowUs - ts <= STALE_AFTER_MS * 1000) present.push(user);
  }
  return present.sort();
}
