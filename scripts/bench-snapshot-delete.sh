#!/bin/bash
# Host writes during a snapshot delete (docs/design/snapshots.md, "Snapshot delete"): how long a
# 4 KiB write waits while the newest snapshot, owning a copy of every map page, is deleted.
#
#   scripts/bench-snapshot-delete.sh [--stria BIN] [--size 1G] [--reps 3] [--dir /dev/shm] [--background] [--clone]
#
# A pool of 2 fast + 6 capacity sparse drive files in DIR (tmpfs by default) and one
# tiered:ec:4+2 volume `v` of SIZE, filled sequentially. Each rep: a snapshot `s`, one block of
# every map page rewritten (so `s` owns a copy of every map page: SIZE / 4 KiB / 255 pages), then
# fio's 4 KiB random writes, qd 16, 4,000 a second for 6 s over NBD; then the same again with
# `snapshot delete v s` started 2 s in. Prints, per rep and as medians: the delete's time and
# pages, and each fio run's completion latency p99, p99.9 and maximum. With `--stria` pointing at
# an older build, the same run measures that build (the script uses only its CLI). The delete is
# `snapshot delete --wait` (the whole delete in the command); with `--background` it is the
# plain command, which the daemon answers once the snapshot is marked deleted: then the
# command's time and the time until `volume show` no longer counts the delete are printed.
# With `--clone` the layer deleted is a clone `c` of `s` that owns a copy of every map page (one
# block of each rewritten in the clone), with `volume delete c` (`--wait` unless --background).
# Needs fio and nbdinfo (scripts/test.sh installs both) and bc. Everything it makes is removed at exit.
set -euo pipefail

STRIA=target/release/stria SIZE=1G REPS=3 DIR=/dev/shm BACKGROUND= CLONE=
while [ $# -gt 0 ]; do
  case "$1" in
    --stria) STRIA=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --background) BACKGROUND=1; shift ;;
    --clone) CLONE=1; shift ;;
    *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$STRIA" ] || { echo "no stria binary at $STRIA (cargo build --release -p stria)" >&2; exit 2; }

POOL=$(mktemp -d "$DIR/stria-delbench.XXXX")
SOCK="$POOL.sock"
SERVE_PID=
FIO_PID=
cleanup() {
  [ -n "$FIO_PID" ] && kill "$FIO_PID" 2>/dev/null || true
  [ -n "$SERVE_PID" ] && kill -9 "$SERVE_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$POOL" "$SOCK"
}
trap cleanup EXIT

st() { "$STRIA" --pool "$POOL" --log-level warn "$@" 2> >(grep -v 'sparse drive file' >&2); }
uri() { echo "nbd+unix:///$1?socket=$SOCK"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# fio_lat OUT: 4 KiB random writes, qd 16, 4,000 a second for 6 s (the snapshot holds what they
# overwrite: unlimited, they would fill the space); writes "p99 p99.9 max" completion latency in
# microseconds to OUT.
fio_lat() {
  fio --name=w --ioengine=nbd --uri="$(uri v)" --rw=randwrite --bs=4k --iodepth=16 --rate_iops=4000 \
    --time_based --runtime=6 --norandommap --randrepeat=0 --percentile_list=99:99.9 --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
t = sys.stdin.read()
w = json.loads(t[t.index("{"):])["jobs"][0]["write"]["clat_ns"]
p = w["percentile"]
print(round(p["99.000000"] / 1000), round(p["99.900000"] / 1000), round(w["max"] / 1000))' >"$1"
}

echo "bench-snapshot-delete on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; $STRIA"
st pool create --fast 2 --capacity 6 --drive-size 400G >/dev/null
st volume create v --size "$SIZE" --layout tiered:ec:4+2 --cache-size 256M >/dev/null
"$STRIA" --pool "$POOL" --log-level warn serve --nbd "unix:$SOCK" >/dev/null 2>&1 &
SERVE_PID=$!
for _ in $(seq 600); do nbdinfo --size "$(uri v)" >/dev/null 2>&1 && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="$(uri v)" --rw=write --bs=1M --iodepth=8 --size="$SIZE" >"$POOL/fill.log" 2>&1 || { tail "$POOL/fill.log"; exit 1; }

# A snapshot `s`, then one block of each map page (255 blocks) rewritten: `s` owns a copy of
# every page and holds only those blocks' old versions.
snapshot_owning_every_page() {
  st snapshot create v s >/dev/null
  fio --name=touch --ioengine=nbd --uri="$(uri v)" --rw=write:1016k --bs=4k --iodepth=8 --size="$SIZE" \
    >"$POOL/touch.log" 2>&1 || { tail "$POOL/touch.log"; exit 1; }
  if [ -n "$CLONE" ]; then
    st volume clone v@s c >/dev/null
    fio --name=touch --ioengine=nbd --uri="$(uri c)" --rw=write:1016k --bs=4k --iodepth=8 --size="$SIZE" \
      >"$POOL/touch.log" 2>&1 || { tail "$POOL/touch.log"; exit 1; }
  fi
}
# Deletes what the setup above made (whole, in the command).
delete_all() {
  [ -z "$CLONE" ] || st volume delete c --wait >/dev/null
  st snapshot delete v s --wait >/dev/null
}

declare -a del_s alone99 alone999 alonemax amid99 amid999 amidmax
for rep in $(seq "$REPS"); do
  # The reference: the same writes with the snapshot there and no delete (deleted after).
  snapshot_owning_every_page
  fio_lat "$POOL/alone"
  delete_all
  snapshot_owning_every_page
  fio_lat "$POOL/amid" &
  FIO_PID=$!
  sleep 2
  if [ -n "$BACKGROUND" ] && [ -n "$CLONE" ]; then
    t0=$(date +%s.%N)
    st volume delete c | grep -q "in the background" || { echo "the clone's delete was not left to the background" >&2; exit 1; }
  elif [ -n "$BACKGROUND" ]; then
    t0=$(date +%s.%N)
    st snapshot delete v s --json | grep -q '"in_background": true' || { echo "the delete was not left to the background" >&2; exit 1; }
  fi
  if [ -n "$BACKGROUND" ]; then
    t1=$(date +%s.%N)
    while st volume show v --json | grep -q '"deletes_in_progress"'; do sleep 0.01; done
    t2=$(date +%s.%N)
    secs=$(echo "$t1 - $t0" | bc)
    pages="the command's time; finished in the background $(echo "$t2 - $t0" | bc | sed 's/^\./0./') s after the command began"
  fi
  if [ -z "$BACKGROUND" ] && [ -n "$CLONE" ]; then
    t0=$(date +%s.%N)
    st volume delete c --wait >/dev/null
    t1=$(date +%s.%N)
    secs=$(echo "$t1 - $t0" | bc)
    pages="every map page dropped"
  elif [ -z "$BACKGROUND" ]; then
    t0=$(date +%s.%N)
    out=$(st snapshot delete v s --wait --json)
    t1=$(date +%s.%N)
  fi
  wait "$FIO_PID" || { echo "fio failed amid the delete" >&2; exit 1; }
  FIO_PID=
  read -r a99 a999 amax <"$POOL/alone"
  read -r m99 m999 mmax <"$POOL/amid"
  [ -n "$BACKGROUND" ] || [ -n "$CLONE" ] || read -r secs pages <<<"$(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(d["seconds"], str(d["map_pages_handed_on"] + d["map_pages_dropped"]) + " map pages")' "$out")"
  [ -n "$BACKGROUND" ] || [ -n "$CLONE" ] || pages="$pages, the command $(echo "$t1 - $t0" | bc | sed 's/^\./0./') s"
  [ -z "$CLONE" ] || pages="clone c: $pages"
  # The snapshot the clone was made of goes too, before the next rep.
  [ -z "$CLONE" ] || st snapshot delete v s --wait >/dev/null
  printf '  rep %d: delete %.3f s (%s); 4 KiB random writes qd 16, completion latency p99 / p99.9 / max: alone %d / %d / %d us, amid the delete %d / %d / %d us\n' \
    "$rep" "$secs" "$pages" "$a99" "$a999" "$amax" "$m99" "$m999" "$mmax"
  del_s+=("$secs"); alone99+=("$a99"); alone999+=("$a999"); alonemax+=("$amax")
  amid99+=("$m99"); amid999+=("$m999"); amidmax+=("$mmax")
done
med() { printf '%s\n' "$@" | median; }
printf 'medians of %d: delete %.3f s; latency p99 / p99.9 / max alone %s / %s / %s us, amid the delete %s / %s / %s us\n' \
  "$REPS" "$(med "${del_s[@]}")" "$(med "${alone99[@]}")" "$(med "${alone999[@]}")" "$(med "${alonemax[@]}")" \
  "$(med "${amid99[@]}")" "$(med "${amid999[@]}")" "$(med "${amidmax[@]}")"
