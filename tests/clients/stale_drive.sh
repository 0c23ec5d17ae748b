#!/usr/bin/env bash
# The outside check of issue 9, with the real binary, real drive files and qemu-io: write 0xaa,
# stop cleanly, copy one drive file; start, overwrite with 0xbb, flush, stop; put the old copy
# back and start. The old copy must be left out (status names it stale), every block must read
# 0xbb, and a scrub must change nothing. On ec:4+2 (a capacity drive) and tiered:ec:4+2 (a fast
# drive holding cache and metadata copies). Then the old copy is rebuilt in place with
# `stria drive replace SLOT PATH` and the volume is healthy again.
# Then the issue-35 cases (docs/design/stale-copies.md): a drive copied *while the daemon serves*
# (after a flushed write), more writes and a flush, the daemon stopped with SIGTERM or kill -9,
# the copy put back: it must be left out and every block must read the new data. On raid1, ec:4+2,
# the fast drive of a tiered:ec:4+2 volume and a capacity drive of a log:ec:4+2 volume (one that
# holds a copy of its cache and map).
# Usage: tests/clients/stale_drive.sh PATH/TO/stria
set -euo pipefail
STRIA=$(realpath "${1:?usage: stale_drive.sh PATH/TO/stria}")
W=$(mktemp -d /var/tmp/stria-stale.XXXX)
PID=
cleanup() {
  set +e
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -9 "$PID"; wait "$PID" 2>/dev/null; fi
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
export STRIA_LOG=${STRIA_LOG:-warn}

start() {
  rm -f "$W/nbd.sock" "$1/stria.sock"
  "$STRIA" serve --pool "$1" --nbd "unix:$W/nbd.sock" >>"$W/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 400); do [ -S "$W/nbd.sock" ] && [ -S "$1/stria.sock" ] && return 0; sleep 0.025; done
  cat "$W/serve.log" >&2; echo "stria serve did not start" >&2; return 1
}
stop() { kill -TERM "$PID"; wait "$PID"; PID=; }
uri() { echo "nbd+unix:///$1?socket=$W/nbd.sock"; }
json() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

check_case() {  # check_case LAYOUT DRIVE-FILE-NAME
  local layout=$1 victim=$2 pool=$W/pool-${1//[:+]/-}
  echo "---- $layout: an old copy of $victim is put back ----"
  "$STRIA" pool create --pool "$pool" --fast 2 --capacity 6 --drive-size 1G >/dev/null
  local extra=(); [[ $layout == tiered* ]] && extra=(--cache-size 64M)
  "$STRIA" volume create v --pool "$pool" --size 256M --layout "$layout" "${extra[@]}" >/dev/null
  start "$pool"
  qemu-io -f raw "$(uri v)" -c 'write -P 0xaa 0 64M' -c flush >/dev/null
  stop
  cp --sparse=always "$pool/drives/$victim" "$W/old.img"
  start "$pool"
  qemu-io -f raw "$(uri v)" -c 'write -P 0xbb 0 64M' -c flush >/dev/null
  stop
  cp --sparse=always "$W/old.img" "$pool/drives/$victim"
  start "$pool"
  local st; st=$("$STRIA" status --pool "$pool" --json || true)
  echo "$st" | json '[i["reason"] for i in d["ignored_drives"]]' | grep -q "stale" \
    || { echo "$st" >&2; echo "$layout: the old copy of $victim was not left out as stale" >&2; exit 1; }
  local out; out=$(qemu-io -f raw "$(uri v)" -c 'read -P 0xbb 0 64M' 2>&1)
  echo "$out" | grep -q "^read 67108864/67108864" || { echo "$out" >&2; echo "$layout: old or no data after the old copy came back" >&2; exit 1; }
  "$STRIA" scrub v --pool "$pool" --json >"$W/scrub.json" || { cat "$W/scrub.json" >&2; exit 1; }
  [ "$(json 'd["parity_blocks_fixed"] + d["copy_blocks_fixed"] + d["inconsistent_blocks"]' <"$W/scrub.json")" = 0 ] \
    || { cat "$W/scrub.json" >&2; echo "$layout: scrub rewrote blocks" >&2; exit 1; }
  qemu-io -f raw "$(uri v)" -c 'read -P 0xbb 0 64M' | grep -q "^read 67108864/67108864"
  # Rebuild the old copy in place from the other drives.
  local slot; slot=$(echo "$st" | json '[x["id"] for x in d["drives"] if x["state"] != "active"][0]')
  "$STRIA" drive replace "$slot" "$pool/drives/$victim" --pool "$pool" >/dev/null
  for _ in $(seq 600); do
    [ "$("$STRIA" volume show v --pool "$pool" --json | json 'd["state"]')" = healthy ] && break; sleep 0.1
  done
  [ "$("$STRIA" volume show v --pool "$pool" --json | json 'd["state"]')" = healthy ] \
    || { echo "$layout: rebuild onto the old copy's file did not finish" >&2; exit 1; }
  qemu-io -f raw "$(uri v)" -c 'read -P 0xbb 0 64M' | grep -q "^read 67108864/67108864"
  stop
  echo "$layout: old copy left out, 0xbb read back, scrub clean, rebuilt in place"
}

# The path of the drive holding the first member of volume $2 of pool $1.
member_path() {
  local slot; slot=$("$STRIA" volume show "$2" --pool "$1" --json | json 'd["segments"][0]["members"][0]["drive"]')
  "$STRIA" status --pool "$1" --json | json "[x['path'] for x in d['drives'] if x['id'] == $slot][0]"
}

live_case() {  # live_case LAYOUT PART-HOLDING-THE-VICTIM TERM|KILL
  local layout=$1 part=$2 how=$3 pool=$W/live-${1//[:+]/-}-$3
  echo "---- $layout: a drive holding $part copied while serving, put back after $how ----"
  "$STRIA" pool create --pool "$pool" --fast 2 --capacity 6 --drive-size 1G >/dev/null
  local extra=(); [[ $layout == tiered* || $layout == log* ]] && extra=(--cache-size 32M)
  "$STRIA" volume create v --pool "$pool" --size 64M --layout "$layout" "${extra[@]}" >/dev/null
  local victim; victim=$(member_path "$pool" "$part")
  start "$pool"
  qemu-io -f raw "$(uri v)" -c 'write -P 0xaa 0 16M' -c flush >/dev/null
  cp --sparse=always "$victim" "$W/live.img"
  # More than the 32M cache ring after the copy, so that the ring wraps and every part's first
  # segment (the victim's) is written again: a cache ring is placed in units (two segments of
  # 16M here), and 16M of writes would land only in the second, leaving the victim's copy
  # current unless destage happened to write it before the stop.
  qemu-io -f raw "$(uri v)" -c 'write -P 0xbb 0 48M' -c flush >/dev/null
  if [ "$how" = TERM ]; then stop; else kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=; fi
  cp --sparse=always "$W/live.img" "$victim"
  start "$pool"
  local st; st=$("$STRIA" status --pool "$pool" --json || true)
  echo "$st" | json '[i["reason"] for i in d["ignored_drives"]]' | grep -q "stale" \
    || { echo "$st" >&2; echo "$layout/$how: the live copy of $victim was not left out as stale" >&2; exit 1; }
  local out; out=$(qemu-io -f raw "$(uri v)" -c 'read -P 0xbb 0 48M' 2>&1)
  echo "$out" | grep -q "^read 50331648/50331648" \
    || { echo "$out" >&2; echo "$layout/$how: old or no data after the live copy came back" >&2; exit 1; }
  "$STRIA" scrub v --pool "$pool" --json >"$W/scrub.json" || { cat "$W/scrub.json" >&2; exit 1; }
  qemu-io -f raw "$(uri v)" -c 'read -P 0xbb 0 48M' | grep -q "^read 50331648/50331648"
  stop
  rm -rf "$pool"
  echo "$layout/$how: live copy left out, 0xbb read back"
}

check_case ec:4+2 capacity-2.img
check_case tiered:ec:4+2 fast-0.img
for how in TERM KILL; do
  live_case raid1 v "$how"
  live_case ec:4+2 v "$how"
  live_case tiered:ec:4+2 v.meta "$how"
  live_case log:ec:4+2 v.cache "$how"
done
echo "stale drive checks passed"
