#!/usr/bin/env bash
# Runs the chat example on one machine: builds the page (and the SDK it needs) if missing,
# starts `sluice serve --public dist` with a JWT secret and the chat's functions, applies the
# setup with demo rooms (general: alice and bob; secret: alice), and prints a URL per user.
# Ctrl-C stops the server. State lives in examples/chat/.run/ (delete it to start over).
#
#   examples/chat/start.sh            # http://127.0.0.1:7070 (PORT=… to change)
#   SLUICE_BIN=/path/to/sluice examples/chat/start.sh
set -euo pipefail
cd "$(dirname "$0")"

PORT="${PORT:-7070}"
URL="http://127.0.0.1:${PORT}"
if [ -n "${SLUICE_BIN:-}" ]; then SLUICE="$SLUICE_BIN"
elif [ -x ../../target/debug/sluice ]; then SLUICE=../../target/debug/sluice
elif command -v sluice >/dev/null; then SLUICE=sluice
else echo "start.sh: no sluice binary: build it (cargo build -p sluice) or set SLUICE_BIN" >&2; exit 1
fi

# The page: sluice-client is built from ../../sdk/ts, then the page bundles it.
if [ ! -f ../../sdk/ts/dist/index.js ]; then (cd ../../sdk/ts && npm ci && npm run build); fi
if [ ! -d node_modules ]; then npm ci; fi
if [ ! -f dist/index.html ]; then npm run build; fi

# Development secrets, kept across runs so the printed URLs keep working after a restart.
umask 077; mkdir -p .run
[ -f .run/jwt-secret ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > .run/jwt-secret
[ -f .run/admin-token ] || { printf 'sluice_admin_'; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; } > .run/admin-token
export SLUICE_JWT_SECRET="$(cat .run/jwt-secret)"
export SLUICE_ADMIN_TOKEN="$(cat .run/admin-token)"

"$SLUICE" serve --data .run/data --listen "127.0.0.1:${PORT}" --public dist --functions functions.js &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
  curl -fs "${URL}/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { echo "start.sh: sluice exited; see its log above" >&2; exit 1; }
  sleep 0.1
done

node setup.mjs --url "$URL" --demo
echo
for user in alice bob; do
  echo "  ${user}: ${URL}/?token=$("$SLUICE" token --sub "$user" --ttl 1d)"
done
echo
echo "Open each URL in its own browser window (the token is kept per tab). Ctrl-C stops the server."
wait "$server"
