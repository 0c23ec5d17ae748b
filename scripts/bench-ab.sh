#!/usr/bin/env bash
# A/B of two stria builds over NBD: what a change costs on the serving path (for example the
# per-request counters and latency histograms of issue 15, against the build before them).
#
# Usage: scripts/bench-ab.sh OLD/stria NEW/stria [--reps N] [--runtime S]
#
# Each binary serves a memory pool (`serve --bench-memory-drives 6x1G`: the NBD path, the
# engine and its checksums, no drive I/O) with a raid0 and an ec:4+2 volume of 1 GiB, filled
# first; fio (nbd engine, Unix socket) runs 4 KiB random reads and writes at iodepth 1 and 16 on
# each, the two servers alternating within every repetition (ABBA order), servers pinned to CPU 1
# and fio to CPU 0. Prints the CPU, each sample, and per workload the medians and NEW/OLD.
# AB_WORKLOADS (see below) picks the workloads.
set -euo pipefail
OLD=$(realpath "${1:?usage: bench-ab.sh OLD/stria NEW/stria [--reps N] [--runtime S]}")
NEW=$(realpath "${2:?usage: bench-ab.sh OLD/stria NEW/stria [--reps N] [--runtime S]}")
shift 2
REPS=5 RUNTIME=3
while (($#)); do
  case $1 in
    --reps) REPS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
W=$(mktemp -d /tmp/stria-ab.XXXX)
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT INT TERM

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; fio $(fio --version)"
echo "old: $OLD ($("$OLD" --version))"
echo "new: $NEW ($("$NEW" --version))"

start() {  # start BINARY: serves r0 and ec on $W/nbd.sock
  rm -f "$W/nbd.sock"
  taskset -c 1 "$1" serve --bench-memory-drives 6x1G --bench-volume r0:raid0:1G --bench-volume ec:ec:4+2:1G \
    --nbd "unix:$W/nbd.sock" --log-level warn >/dev/null 2>&1 &
  PID=$!
  for _ in $(seq 200); do [ -S "$W/nbd.sock" ] && break; sleep 0.05; done
  for v in r0 ec; do
    taskset -c 0 fio --name=fill --ioengine=nbd --uri="nbd+unix:///$v?socket=$W/nbd.sock" --rw=write --bs=1M \
      --iodepth=8 --size=1G --output-format=terse >/dev/null
  done
}
stop() { kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

run() {  # run VOLUME RW DEPTH: prints IOPS
  taskset -c 0 fio --name=ab --ioengine=nbd --uri="nbd+unix:///$1?socket=$W/nbd.sock" --rw="$2" --bs=4k \
    --iodepth="$3" --size=1G --time_based --runtime="$RUNTIME" --output-format=json --output="$W/fio.json" >/dev/null
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["read"]["iops"] + j["write"]["iops"]))' "$W/fio.json"
}

# AB_WORKLOADS="r0 randwrite 16;ec randwrite 16" runs only those (VOLUME RW IODEPTH, ;-separated).
IFS=';' read -r -a WORKLOADS <<<"${AB_WORKLOADS:-r0 randread 1;r0 randread 16;r0 randwrite 16;ec randread 16;ec randwrite 16}"
declare -A samples
for rep in $(seq "$REPS"); do
  order=(OLD NEW); ((rep % 2 == 0)) && order=(NEW OLD)
  for which in "${order[@]}"; do
    bin=$OLD; [ "$which" = NEW ] && bin=$NEW
    start "$bin"
    for w in "${WORKLOADS[@]}"; do
      # shellcheck disable=SC2086
      iops=$(run $w)
      samples["$which $w"]+="$iops "
      echo "rep $rep $which $w: $iops IOPS"
    done
    stop
  done
done

printf '\n%-22s %12s %12s %8s\n' workload "old IOPS" "new IOPS" new/old
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for w in "${WORKLOADS[@]}"; do
  o=$(echo "${samples["OLD $w"]}" | median)
  n=$(echo "${samples["NEW $w"]}" | median)
  printf '%-22s %12s %12s %8s\n' "$w" "$o" "$n" "$(awk -v n="$n" -v o="$o" 'BEGIN { printf "%.3f", n / o }')"
done
