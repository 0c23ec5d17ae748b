#!/bin/bash
# Snapshots of log-structured volumes (docs/design/snapshots.md, "Measured"): what making one
# costs, what a chain of 16 costs reads, and what deleting one writes.
#
#   scripts/bench-snapshots.sh [--stria BIN] [--size 2G] [--runtime 5] [--reps 3] [--dir /dev/shm]
#
# A pool of 2 fast + 6 capacity sparse drive files in DIR (tmpfs by default) and two
# tiered:ec:4+2 volumes, `a` and `b`, of SIZE, written the same way: filled sequentially, then 16
# rounds of 4 KiB random writes, round i inside its own 1/32 of the volume. `b` gets a snapshot
# before each round, so snapshot s1 owns copies of only the map pages round 1 changed and reading
# it walks the tables of the 15 newer ones for every other page (the worst case for a chain).
# Prints, medians of REPS fio runs of RUNTIME seconds (4 KiB random reads, qd 16, over NBD):
#   * read IOPS of `a` (no snapshot), of `b` (16 snapshots) and of `b@s1`, and the ratios;
#   * `snapshot create` time (through the daemon, the CLI's start included) of idle 1 GiB and
#     1 TiB volumes, and of the 1 GiB one under a 4 KiB random-write load;
#   * `snapshot delete` of a middle, the newest and the oldest snapshot of `b`: time, map pages
#     handed on / dropped, blocks freed, and the bytes each part of `b` wrote meanwhile (the
#     cache and the segment space hold data: a delete that copied none writes nothing there);
#   * clones: `volume clone` time; a snapshot `k` of `b` with two clones, each written with 4 KiB
#     random writes (the bytes the cache and segment space took per host byte of those writes:
#     1 for the cache if nothing but the written blocks is copied); read IOPS of a clone; then
#     `snapshot delete b k` (kept for its clones), and the deletes of both clones (the second
#     finishes k's): time, and the bytes each part of `b` wrote meanwhile (data: 0 if nothing
#     is copied);
#   * bytes each part of `a` and `b` took for the whole sequence, per host byte.
# Needs fio and nbdinfo (scripts/test.sh installs both) and bc. Everything it makes is removed at exit.
set -euo pipefail

STRIA=target/release/stria SIZE=2G RUNTIME=5 REPS=3 DIR=/dev/shm
while [ $# -gt 0 ]; do
  case "$1" in
    --stria) STRIA=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$STRIA" ] || { echo "no stria binary at $STRIA (cargo build --release -p stria)" >&2; exit 2; }

POOL=$(mktemp -d "$DIR/stria-snapbench.XXXX")
SOCK="$POOL.sock"
SERVE_PID=
cleanup() {
  [ -n "$SERVE_PID" ] && kill -9 "$SERVE_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$POOL" "$SOCK"
}
trap cleanup EXIT

# The sparse drives promise more than tmpfs holds (only what is written takes memory): the CLI's
# warning about it is left out.
st() { "$STRIA" --pool "$POOL" --log-level warn "$@" 2> >(grep -v 'sparse drive file' >&2); }
uri() { echo "nbd+unix:///$1?socket=$SOCK"; }
now() { date +%s.%N; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
bytes() { numfmt --from=iec "$1"; }

# counter VOLUME FIELD [PART]: a counter of a log-structured volume (`stria status --json`).
counter() {
  st status --json | python3 -c '
import json, sys
t = [t for t in json.load(sys.stdin)["log"] if t["name"] == sys.argv[1]][0]
part = sys.argv[3] if len(sys.argv) > 3 else ""
print((([p for p in t["parts"] if p["role"] == part][0]) if part else t)[sys.argv[2]])' "$@"
}
parts_written() {  # parts_written VOLUME: "cache meta seg" bytes written by each part
  echo "$(counter "$1" write_bytes cache) $(counter "$1" write_bytes meta) $(counter "$1" write_bytes seg)"
}
# Waits until VOLUME's parts write nothing for 2 s (destage and GC idle).
settle() {
  local last now_
  last=$(parts_written "$1")
  for _ in $(seq 120); do
    sleep 2
    now_=$(parts_written "$1")
    [ "$now_" = "$last" ] && return 0
    last=$now_
  done
  echo "warning: $1 still writing after 240 s" >&2
}
fio_read_iops() {  # fio_read_iops EXPORT: 4 KiB random reads, qd 16, RUNTIME s -> IOPS
  fio --name=r --ioengine=nbd --uri="$(uri "$1")" --rw=randread --bs=4k --iodepth=16 --time_based \
    --runtime="$RUNTIME" --norandommap --randrepeat=0 --output-format=json 2>/dev/null |
    python3 -c 'import json, sys; t = sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))'
}

echo "bench-snapshots on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
echo "pool: 2 fast + 6 capacity sparse drives in $DIR; volumes a and b: $SIZE tiered:ec:4+2, 256 MiB cache"
st pool create --fast 2 --capacity 6 --drive-size 1200G >/dev/null
for v in a b; do st volume create "$v" --size "$SIZE" --layout tiered:ec:4+2 --cache-size 256M >/dev/null; done
st volume create c1g --size 1G --layout tiered:ec:4+2 >/dev/null
st volume create c1t --size 1T --layout tiered:ec:4+2 >/dev/null
# Started directly (not through `st`, a function: its background subshell's pid is not the
# server's, and the cleanup must kill the server).
"$STRIA" --pool "$POOL" --log-level warn serve --nbd "unix:$SOCK" >/dev/null 2>&1 &
SERVE_PID=$!
for _ in $(seq 600); do nbdinfo --size "$(uri a)" >/dev/null 2>&1 && break; sleep 0.1; done

size=$(bytes "$SIZE")
window=$((size / 32))
for v in a b; do
  fio --name=fill --ioengine=nbd --uri="$(uri "$v")" --rw=write --bs=1M --iodepth=8 --size="$size" >/dev/null 2>&1
done
for i in $(seq 1 16); do
  st snapshot create b "s$i" >/dev/null
  for v in a b; do
    # The same offsets for both volumes (same seed): round i stays in window i.
    fio --name=round --ioengine=nbd --uri="$(uri "$v")" --rw=randwrite --bs=4k --iodepth=16 \
      --offset=$((i * window)) --size="$window" --io_size=$((window / 4)) --norandommap \
      --randseed="$i" >/dev/null 2>&1
  done
done
settle a; settle b
echo "written: fill + 16 rounds of $((window / 4 >> 20)) MiB of 4 KiB random writes; b has $(st snapshot list b --json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))') snapshots"

declare -A iops
for rep in $(seq "$REPS"); do
  for e in a b b@s1; do iops[$e]+="$(fio_read_iops "$e") "; done
done
ma=$(tr ' ' '\n' <<<"${iops[a]}" | grep . | median)
mb=$(tr ' ' '\n' <<<"${iops[b]}" | grep . | median)
ms=$(tr ' ' '\n' <<<"${iops[b@s1]}" | grep . | median)
echo "4 KiB random reads, qd 16, median of $REPS x ${RUNTIME} s:"
printf '  a (no snapshot) %s IOPS [%s]\n  b (16 snapshots) %s IOPS [%s]  b/a = %.3f\n  b@s1 (oldest of 16) %s IOPS [%s]  b@s1/a = %.3f\n' \
  "$ma" "${iops[a]% }" "$mb" "${iops[b]% }" "$(echo "$mb / $ma" | bc -l)" "$ms" "${iops[b@s1]% }" "$(echo "$ms / $ma" | bc -l)"

# `snapshot list` counts, per snapshot, the data it references (a pass over the whole map) and
# the bytes only it holds (a walk of its own pages); `volume list` beside it is the command's
# floor (a round trip to the daemon).
list_times() {  # list_times ARGS...: 5 runs of `stria ARGS`, their times
  for k in 1 2 3 4 5; do
    t0=$(now)
    st "$@" >/dev/null
    echo "$(now) - $t0" | bc
  done
}
lt=$(list_times snapshot list b)
vt=$(list_times volume list)
printf '  snapshot list b (16 snapshots of %s): median %.3f s [%s]; volume list: median %.3f s\n' \
  "$SIZE" "$(median <<<"$lt")" "$(echo $lt)" "$(median <<<"$vt")"

create_times() {  # create_times VOLUME PREFIX: 5 creates, their times
  for k in 1 2 3 4 5; do
    t0=$(now)
    st snapshot create "$1" "$2$k" >/dev/null
    echo "$(now) - $t0" | bc
  done
}
for v in c1g c1t; do
  ts=$(create_times "$v" t)
  printf '  snapshot create, idle %s volume: median %.3f s [%s]\n' "$v" "$(median <<<"$ts")" "$(echo $ts)"
done
fio --name=load --ioengine=nbd --uri="$(uri c1g)" --rw=randwrite --bs=4k --iodepth=16 --time_based \
  --runtime=60 --norandommap --randrepeat=0 >/dev/null 2>&1 &
FIO_PID=$!
sleep 3
ts=$(create_times c1g load)
kill "$FIO_PID" 2>/dev/null || true
wait "$FIO_PID" 2>/dev/null || true
printf '  snapshot create, c1g under 4 KiB random writes qd 16: median %.3f s [%s]\n' "$(median <<<"$ts")" "$(echo $ts)"

settle b
for s in s8 s16 s1; do
  read -r c0 m0 g0 <<<"$(parts_written b)"
  out=$(st snapshot delete b "$s" --wait --json)
  read -r c1 m1 g1 <<<"$(parts_written b)"
  python3 - "$s" "$out" $((c1 - c0)) $((m1 - m0)) $((g1 - g0)) <<'PY'
import json, sys
s, d = sys.argv[1], json.loads(sys.argv[2])
cache, meta, seg = map(int, sys.argv[3:6])
print(f"  snapshot delete b@{s}: {d['seconds']:.3f} s, {d['map_pages_handed_on']} map pages handed on, "
      f"{d['map_pages_dropped']} dropped, {d['blocks_freed']} blocks freed; written meanwhile: "
      f"cache {cache} B, segments {seg} B (data), map {meta / 1024:.0f} KiB")
PY
done

# Clones: a snapshot k of b, two clones of it, each written; then k and both clones deleted.
st snapshot create b k >/dev/null
for c in kc1 kc2; do
  t0=$(now)
  st volume clone b@k "$c" >/dev/null
  printf '  volume clone b@k %s: %.3f s\n' "$c" "$(echo "$(now) - $t0" | bc)"
done
settle b
read -r c0 m0 g0 <<<"$(parts_written b)"
# Each clone in a window of its own, as the rounds were: what a clone's writes cost is then not
# mixed with growing the snapshot page pool (made for about two full copies of the map).
k=0
for c in kc1 kc2; do
  k=$((k + 1))
  fio --name=clone --ioengine=nbd --uri="$(uri "$c")" --rw=randwrite --bs=4k --iodepth=16 \
    --offset=$(((16 + k) * window)) --size="$window" --io_size=$((window / 4)) --norandommap \
    --randseed=$((99 + k)) >/dev/null || { echo "fio on clone $c failed" >&2; exit 1; }
done
written=$((2 * (window / 4)))
read -r c1 m1 g1 <<<"$(parts_written b)"
printf '  4 KiB random writes to the clones (%d MiB): cache took %.3f, map %.3f per host byte (before destage)\n' \
  $((written >> 20)) "$(echo "($c1 - $c0) / $written" | bc -l)" "$(echo "($m1 - $m0) / $written" | bc -l)"
settle b
ic=$(for rep in $(seq "$REPS"); do fio_read_iops kc1; done | median)
printf '  kc1 (a clone of b@k) 4 KiB random reads %s IOPS, kc1/a = %.3f\n' "$ic" "$(echo "$ic / $ma" | bc -l)"
# --wait: the whole delete in the command (without it the daemon finishes it in the background).
for step in "snapshot delete b k --wait" "volume delete kc1 --wait" "volume delete kc2 --wait"; do
  read -r c0 m0 g0 <<<"$(parts_written b)"
  t0=$(now)
  # shellcheck disable=SC2086
  st $step >/dev/null
  t1=$(now)
  read -r c1 m1 g1 <<<"$(parts_written b)"
  printf '  %s: %.3f s; written meanwhile: cache %d B, segments %d B (data), map %d KiB\n' "$step" \
    "$(echo "$t1 - $t0" | bc)" $((c1 - c0)) $((g1 - g0)) $(((m1 - m0) / 1024))
done
settle b

echo "whole sequence (fill, 16 rounds, and for b 16 snapshots, 3 deletes, the clones), bytes each part took per host byte"
echo "(part bytes: before the segment space's ec:4+2 parity, x1.5 on the capacity drives, and the fast parts' mirror, x2):"
for v in a b; do
  host=$(counter "$v" host_write_bytes)
  read -r c m g <<<"$(parts_written "$v")"
  printf '  %s: host wrote %d MiB; segment space %.3f, cache %.3f, map %.3f\n' "$v" $((host >> 20)) \
    "$(echo "$g / $host" | bc -l)" "$(echo "$c / $host" | bc -l)" "$(echo "$m / $host" | bc -l)"
done
