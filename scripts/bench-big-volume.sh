#!/bin/bash
# A very large log-structured volume under uniform random writes: what the map costs when it is
# far larger than its cache (docs/design/log-structured-volumes.md, "Checkpoints that do not stop
# writers").
#
#   scripts/bench-big-volume.sh [--stria BIN] [--size 30T] [--drive-size 8T] [--runtime 60]
#                               [--dir /dev/shm]
#
# Creates a pool of 2 fast + 6 capacity sparse drive files in DIR (tmpfs by default, so the drives
# cost no disk: only what is written takes memory), one tiered:ec:4+2 volume of SIZE, serves it,
# runs fio 4 KiB random writes at qd 16 over the whole volume through NBD for RUNTIME seconds, then
# starts another fio run and kills the daemon with SIGKILL 10 s into it, and serves again. Prints
# the CPU, the IOPS and latencies, the daemon's RSS, and how long each start took. Needs fio and
# nbdinfo (scripts/test.sh installs both). Everything it makes is removed at exit.
set -euo pipefail

STRIA=target/release/stria SIZE=30T DRIVE=8T RUNTIME=60 DIR=/dev/shm
while [ $# -gt 0 ]; do
  case "$1" in
    --stria) STRIA=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --drive-size) DRIVE=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$STRIA" ] || { echo "no stria binary at $STRIA (cargo build --release -p stria)" >&2; exit 2; }

POOL=$(mktemp -d "$DIR/stria-big.XXXX")
SOCK="$POOL.sock"
URI="nbd+unix:///big?socket=$SOCK"
SERVE_PID=
cleanup() {
  [ -n "$SERVE_PID" ] && kill -9 "$SERVE_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$POOL" "$SOCK"
}
trap cleanup EXIT

now() { date +%s.%N; }
serve() {
  local t0; t0=$(now)
  "$STRIA" --pool "$POOL" --log-level warn serve --nbd "unix:$SOCK" >/dev/null 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 6000); do nbdinfo --size "$URI" >/dev/null 2>&1 && break; sleep 0.1; done
  nbdinfo --size "$URI" >/dev/null
  printf '%s ready after %.2f s, RSS %s MiB\n' "$1" "$(echo "$(now) - $t0" | bc)" \
    "$(( $(ps -o rss= -p "$SERVE_PID") / 1024 ))"
}
fio_random_writes() {
  fio --name=w --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=16 --time_based \
    --runtime="$1" --norandommap --randrepeat=0 --random_generator=tausworthe64 "${@:2}"
}

echo "bench-big-volume on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
echo "pool: 2 fast + 6 capacity drives of $DRIVE in $DIR; volume: $SIZE tiered:ec:4+2"
"$STRIA" --pool "$POOL" --log-level warn pool create --fast 2 --capacity 6 --drive-size "$DRIVE" >/dev/null
t0=$(now)
"$STRIA" --pool "$POOL" --log-level warn volume create big --size "$SIZE" --layout tiered:ec:4+2 >/dev/null
printf 'volume create took %.2f s\n' "$(echo "$(now) - $t0" | bc)"
serve "serve"
fio_random_writes "$RUNTIME" --output-format=json >"$POOL/fio.json" 2>/dev/null
python3 - "$POOL/fio.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
c, p = w["clat_ns"], w["clat_ns"]["percentile"]
print("random 4 KiB writes, qd 16, %.0f s: %.0f IOPS, latency mean %.0f us, p99 %.0f us, p99.9 %.0f us, max %.0f ms"
      % (w["runtime"] / 1000, w["iops"], c["mean"] / 1e3, p["99.000000"] / 1e3, p["99.900000"] / 1e3, c["max"] / 1e6))
PY
echo "RSS after the run: $(( $(ps -o rss= -p "$SERVE_PID") / 1024 )) MiB"
fio_random_writes 30 >/dev/null 2>&1 &
FIO_PID=$!
sleep 10
kill -9 "$SERVE_PID"
wait "$SERVE_PID" 2>/dev/null || true
wait "$FIO_PID" 2>/dev/null || true
serve "serve after kill -9 under load"
kill -TERM "$SERVE_PID"
wait "$SERVE_PID" || true
SERVE_PID=
echo "drive files hold $(du -sh "$POOL" | cut -f1)"
