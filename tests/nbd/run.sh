#!/bin/bash
# Builds nbd-mem-server, serves a 1 GiB export on a temporary Unix socket, runs the python tests
# (pytest, python3-libnbd) and the shared real-client recipe against it, and tears everything down.
# Usage: tests/nbd/run.sh            (needs root for the recipe's losetup/mount)
# Env: SKIP_RECIPE=1 skips the recipe; PYTEST_ARGS adds pytest arguments.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-nbd}
PY=/usr/bin/python3
$PY -c 'import nbd, pytest' 2>/dev/null || { echo "run.sh: needs python3-libnbd and python3-pytest (apt-get install python3-libnbd python3-pytest)" >&2; exit 2; }

cargo build -q --release -p stria-nbd --example nbd-mem-server --manifest-path "$ROOT/Cargo.toml"
export NBD_SERVER_BIN=$CARGO_TARGET_DIR/release/examples/nbd-mem-server

W=$(mktemp -d /tmp/nbd-run.XXXX); PID=
cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill "$PID"; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT INT TERM

SOCK=$W/nbd.sock
"$NBD_SERVER_BIN" --unix "$SOCK" --size 1G --export disk --ro-export ro --faulty-export bad \
  --slow-zero-export slowzero 2>"$W/server.log" & PID=$!
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.025; done
[ -S "$SOCK" ] || { cat "$W/server.log" >&2; exit 1; }

status=0
NBD_SOCKET=$SOCK NBD_EXPORT=disk NBD_RO_EXPORT=ro NBD_FAULTY_EXPORT=bad NBD_SLOWZERO_EXPORT=slowzero \
  $PY -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} "$ROOT/tests/nbd" || status=1
if [ "${SKIP_RECIPE:-0}" != 1 ]; then
  "$ROOT/tests/nbd/clients.sh" "$SOCK" disk || status=1
fi
kill -0 "$PID" 2>/dev/null || { echo "run.sh: the server died" >&2; status=1; }
if grep -E 'panicked|ERROR' "$W/server.log" >&2; then status=1; fi
[ $status = 0 ] && echo "nbd run: all passed" || echo "nbd run: FAILED" >&2
exit $status
