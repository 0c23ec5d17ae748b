#!/usr/bin/env bash
# A/B of two stria builds on what a client flush costs, with real file drives (fdatasync on the
# host filesystem): the flush epochs of issue 35 (docs/design/stale-copies.md) against the build
# before them.
#
# Usage: scripts/bench-flush-ab.sh OLD/stria NEW/stria [--reps N] [--runtime S] [--dir DIR]
#
# Each binary serves its own pool of file drives in DIR (default /var/tmp: a disk filesystem,
# where a flush reaches the device; tmpfs would make it free): 2 fast and 6 capacity drives of
# 2 GiB, a raid1 volume, an ec:4+2 volume and a log:ec:4+2 volume of 1 GiB. fio (nbd engine,
# Unix socket) writes 4 KiB random blocks at depth 1 with a flush after every write
# (`--fsync=1`), and at depth 16 with a flush after every 64 writes, on each volume. The servers
# alternate within every repetition (ABBA order); server on CPU 1, fio on CPU 0. Prints the CPU,
# each sample, and per workload the medians and NEW/OLD.
set -euo pipefail
OLD=$(realpath "${1:?usage: bench-flush-ab.sh OLD/stria NEW/stria [--reps N] [--runtime S] [--dir DIR]}")
NEW=$(realpath "${2:?usage: bench-flush-ab.sh OLD/stria NEW/stria [--reps N] [--runtime S] [--dir DIR]}")
shift 2
REPS=4 RUNTIME=5 DIR=/var/tmp
while (($#)); do
  case $1 in
    --reps) REPS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
W=$(mktemp -d "$DIR/stria-flush-ab.XXXX")
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT INT TERM

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; fio $(fio --version)"
echo "drives on: $(df -T "$W" | awk 'NR==2 {print $2, $1}')"
echo "old: $OLD ($("$OLD" --version))"
echo "new: $NEW ($("$NEW" --version))"

for which in OLD NEW; do
  bin=$OLD; [ "$which" = NEW ] && bin=$NEW
  pool=$W/pool-$which
  "$bin" pool create --pool "$pool" --fast 2 --capacity 6 --drive-size 2G >/dev/null
  "$bin" volume create r1 --pool "$pool" --size 1G --layout raid1 >/dev/null
  "$bin" volume create ec --pool "$pool" --size 1G --layout ec:4+2 >/dev/null
  "$bin" volume create lg --pool "$pool" --size 1G --layout log:ec:4+2 --cache-size 256M >/dev/null
done

start() {  # start OLD|NEW: serves that build's pool on $W/nbd.sock
  local bin=$OLD; [ "$1" = NEW ] && bin=$NEW
  rm -f "$W/nbd.sock"
  STRIA_LOG=warn taskset -c 1 "$bin" serve --pool "$W/pool-$1" --nbd "unix:$W/nbd.sock" >/dev/null 2>&1 &
  PID=$!
  for _ in $(seq 400); do [ -S "$W/nbd.sock" ] && break; sleep 0.05; done
  [ -S "$W/nbd.sock" ] || { echo "$1 did not start" >&2; exit 1; }
}
stop() { kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

run() {  # run VOLUME DEPTH FSYNC: prints write IOPS
  taskset -c 0 fio --name=ab --ioengine=nbd --uri="nbd+unix:///$1?socket=$W/nbd.sock" --rw=randwrite --bs=4k \
    --iodepth="$2" --fsync="$3" --size=256M --time_based --runtime="$RUNTIME" --output-format=json \
    --output="$W/fio.json" >/dev/null
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["write"]["iops"]))' "$W/fio.json"
}

IFS=';' read -r -a WORKLOADS <<<"${AB_WORKLOADS:-r1 1 1;ec 1 1;lg 1 1;r1 16 64;ec 16 64;lg 16 64}"
declare -A samples
for rep in $(seq "$REPS"); do
  order=(OLD NEW); ((rep % 2 == 0)) && order=(NEW OLD)
  for which in "${order[@]}"; do
    start "$which"
    for w in "${WORKLOADS[@]}"; do
      read -r vol depth fsync <<<"$w"
      iops=$(run "$vol" "$depth" "$fsync")
      samples["$which $w"]+="$iops "
      echo "rep $rep $which $vol qd$depth fsync=$fsync: $iops IOPS"
    done
    stop
  done
done

echo
printf '%-28s %10s %10s %8s\n' "workload (4 KiB randwrite)" "OLD" "NEW" "NEW/OLD"
for w in "${WORKLOADS[@]}"; do
  read -r vol depth fsync <<<"$w"
  python3 - "$vol qd$depth fsync=$fsync" ${samples["OLD $w"]} -- ${samples["NEW $w"]} <<'PY'
import statistics, sys
name = sys.argv[1]
args = sys.argv[2:]
cut = args.index("--")
old = statistics.median(float(x) for x in args[:cut])
new = statistics.median(float(x) for x in args[cut + 1:])
print(f"{name:<28} {old:>10.0f} {new:>10.0f} {new / old:>8.3f}")
PY
done
