#!/usr/bin/env bash
# The one command that runs every check CI runs: format, lints, unit, integration, crash and
# bench smoke tests. Installs what it needs on a fresh Debian machine of this kind.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# PostgreSQL is a peer in `sluice bench`; its smoke test starts a real server.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then need_apt+=(postgresql); fi
# Redis is the peer of `sluice bench fanout` and of the topic rows of `sluice bench ingest`.
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust with rustup first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# No doc tests: the crates have none, and their empty "0 passed" lines would close the run.
cargo test --workspace --locked --lib --bins --tests -- --test-threads 2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '; ([0-9]+) failed' "$log" | grep -Eo '[0-9]+' | awk '{s+=$1} END {print s+0}')
echo
echo "tests: $passed passed, $failed failed"
exit "$status"
