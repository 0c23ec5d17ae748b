#!/bin/bash
# The web dashboard's test in headless Chromium (issue 15). Usage: tests/ui/run.sh PATH/TO/stria
# Makes a pool in a temporary folder (2 fast + 6 capacity drives of 1G, volumes v ec:4+2,
# t tiered:ec:4+2 with a snapshot s1 and its clone tc, and l log:ec:4+2 with 3 copies of its
# cache and map, so that two failed capacity drives leave it readable), serves it over NBD and
# HTTP, writes through NBD, then runs dashboard.mjs, which
# drives the page as a person would (see the checks there). Screenshots: target/ui-screenshots/.
# Needs chromium, node, npm, qemu-io: installs the missing ones with apt-get (Debian 12, as root).
# The last line is "dashboard: N passed, M failed"; exits non-zero if any check failed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
STRIA=${1:?usage: tests/ui/run.sh PATH/TO/stria}
STRIA=$(cd "$(dirname "$STRIA")" && pwd)/$(basename "$STRIA")
[ -x "$STRIA" ] || { echo "dashboard: $STRIA is not an executable" >&2; exit 2; }

# --- what the test needs ---
SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v qemu-io >/dev/null || missing+=(qemu-utils)
if [ ${#missing[@]} -gt 0 ]; then
  echo "dashboard: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
CHROMIUM=${CHROMIUM:-$(command -v chromium)}
# playwright-core only (no browser download), pinned by package-lock.json
want=$(node -p 'require(process.argv[1]).packages["node_modules/playwright-core"].version' "$HERE/package-lock.json")
have=$(node -p 'require(process.argv[1]).version' "$HERE/node_modules/playwright-core/package.json" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# --- a pool, served ---
W=$(mktemp -d /tmp/stria-ui.XXXXXX)
P=$W/pool
SERVER=
cleanup() {
  if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
    kill "$SERVER" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER" 2>/dev/null || true
  fi
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$STRIA" pool create --pool "$P" --fast 2 --capacity 6 --drive-size 1G >/dev/null
"$STRIA" volume create v --pool "$P" --size 256M --layout ec:4+2 >/dev/null
"$STRIA" volume create t --pool "$P" --size 256M --layout tiered:ec:4+2 >/dev/null
"$STRIA" volume create l --pool "$P" --size 64M --layout log:ec:4+2 --cache-copies 3 >/dev/null
"$STRIA" snapshot create t s1 --pool "$P" >/dev/null
"$STRIA" volume clone t@s1 tc --pool "$P" >/dev/null

PORT=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$STRIA" serve --pool "$P" --nbd "unix:$P/nbd.sock" --http "tcp:127.0.0.1:$PORT" >"$W/serve.log" 2>&1 &
SERVER=$!
URL=http://127.0.0.1:$PORT/
for _ in $(seq 100); do
  if [ -S "$P/nbd.sock" ] && [ -s "$P/http.token" ] &&
     node -e 'fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))' "${URL}api/v1/status" 2>/dev/null; then
    break
  fi
  kill -0 "$SERVER" 2>/dev/null || { echo "dashboard: stria serve exited:"; cat "$W/serve.log"; exit 1; }
  sleep 0.1
done

# something to chart: data on both volumes before the page opens (it writes more while it is open)
qemu-io -f raw "nbd+unix:///v?socket=$P/nbd.sock" -c "write -P 0xab 0 16M" >/dev/null
qemu-io -f raw "nbd+unix:///t?socket=$P/nbd.sock" -c "write -P 0xcd 0 16M" >/dev/null

mkdir -p "$ROOT/target/ui-screenshots"
rc=0
STRIA="$STRIA" POOL="$P" URL="$URL" CHROMIUM="$CHROMIUM" SHOTS="$ROOT/target/ui-screenshots" \
  node "$HERE/dashboard.mjs" | tee "$W/out" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "--- stria serve log (last 30 lines) ---"; tail -n 30 "$W/serve.log"
  grep '^dashboard: ' "$W/out" | tail -n 1 || echo "dashboard: 0 passed, 1 failed"
fi
exit "$rc"
