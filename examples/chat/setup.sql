-- The chat example's schema and read rules. Apply with the admin token:
--   node setup.mjs --url http://127.0.0.1:7070 --admin-token T   (also creates the presence topic)
-- Safe to apply again: tables and indexes use IF NOT EXISTS, policies are dropped and re-created.

CREATE TABLE IF NOT EXISTS rooms (id TEXT PRIMARY KEY, name TEXT NOT NULL);

-- One row per (room, user); the id is room || ':' || user_id so that the `send` function can
-- check membership with a key lookup: tx.get('members', room + ':' + auth.sub).
CREATE TABLE IF NOT EXISTS members (id TEXT PRIMARY KEY, room TEXT NOT NULL, user_id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS members_user ON members (user_id);

-- Written only by the `send` function (functions.js): there is no INSERT policy, so a client
-- cannot insert, update or delete a message directly.
CREATE TABLE IF NOT EXISTS messages (
  id TEXT PRIMARY KEY,
  room TEXT NOT NULL,
  author TEXT NOT NULL,
  body TEXT NOT NULL,
  ts TIMESTAMP NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_room ON messages (room, ts);

-- Reads: a user sees its own memberships, the rooms it belongs to and their messages.
DROP POLICY IF EXISTS own_memberships ON members;
CREATE POLICY own_memberships ON members FOR SELECT USING (user_id = auth.sub);

DROP POLICY IF EXISTS member_rooms ON rooms;
CREATE POLICY member_rooms ON rooms FOR SELECT
  USING (id IN (SELECT room FROM members WHERE user_id = auth.sub));

DROP POLICY IF EXISTS member_reads ON messages;
CREATE POLICY member_reads ON messages FOR SELECT
  USING (room IN (SELECT room FROM members WHERE user_id = auth.sub));
