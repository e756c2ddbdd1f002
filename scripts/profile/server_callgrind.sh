#!/usr/bin/env bash
# Instructions the server spends per HTTP request, host-independent (this project's VMs have
# no hardware counters and their wall clock swings 2–3× from hour to hour):
#
#   scripts/profile/server_callgrind.sh BIN mutate|call|ws-mutate|ws-call [N] [OUT]
#
# runs `BIN serve` under valgrind's callgrind on a temporary directory (with
# examples/bank.js), sends a warm-up of N/2 requests (http_load.py: over HTTP, or with ws-
# over one WebSocket in MessagePack, as the SDK sends them), zeroes the counts, sends
# N more, dumps, and prints the instructions per request of the whole process and of its
# main parts. Needs valgrind and python3. Compare two builds by running it on each.
set -euo pipefail
BIN=$(realpath "$1"); MODE=$2; N=${3:-400}; OUT=${4:-/tmp/server-callgrind.$MODE}
HERE=$(cd "$(dirname "$0")" && pwd)
TOKEN=sluice_admin_callgrind_0123456789abcdef
DIR=$(mktemp -d); PORT=$((20000 + RANDOM % 20000))
rm -f "$OUT" "$OUT".*
valgrind --tool=callgrind --callgrind-out-file="$OUT" "$BIN" serve --data "$DIR/data" \
  --listen 127.0.0.1:$PORT --admin-token $TOKEN --functions "$HERE/../../examples/bank.js" \
  --durability fsync > "$DIR/log" 2>&1 &
VG=$!
trap 'kill $VG 2>/dev/null || true; rm -rf "$DIR"' EXIT
for _ in $(seq 1 120); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 1; done
python3 "$HERE/http_load.py" $PORT $TOKEN "$MODE" 0 $((N / 2))
callgrind_control -z $VG > /dev/null 2>&1
python3 "$HERE/http_load.py" $PORT $TOKEN "$MODE" $((N / 2)) "$N"
callgrind_control -d $VG > /dev/null 2>&1
sleep 1
callgrind_annotate --auto=no --inclusive=yes "$OUT".1 2>/dev/null \
  | grep -E "PROGRAM TOTALS|Writer::round \[|decode::json::read \[|api::mutate_reply_json \[|api::json_body::\{\{closure\}\} \[|ws::connection::\{\{closure\}\} \[" \
  | awk -v n="$N" '{gsub(",", "", $1); printf "%9.0f per request  %s\n", $1 / n, substr($0, index($0, $3), 100)}'
echo "profile: $OUT.1 (callgrind_annotate --inclusive=yes $OUT.1)"
