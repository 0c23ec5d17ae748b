#!/usr/bin/env bash
# Sustained 4 KiB random writes through NBD, two builds alternated (docs/design/datapath.md §6).
#
# Usage: scripts/ab-writes.sh --a BIN --b BIN [--layout log:ec:4+2] [--reps 3] [--warm 20]
#                             [--seconds 10]
#
# Each run starts a fresh `stria serve` pinned on CPU 1 over in-process memory drives (2 fast +
# 6 capacity, `--bench-memory-drives`; one 1 GiB volume of LAYOUT), fills the volume with
# nbdcopy, writes at random for --warm seconds unmeasured (so that a thin volume's GC is at its
# steady state), then measures --seconds of fio 4 KiB random writes at qd16 (fio on CPU 0).
# Builds A and B alternate, --reps runs each. Prints each run's kIOPS, the server's CPU per
# write (its CPU time over the measured writes, background work included) and p99, then the
# medians. Needs fio, nbdcopy, taskset. Takes about 50 s per run.
set -euo pipefail
A= B= LAYOUT=log:ec:4+2 REPS=3 WARM=20 SECS=10
while (($#)); do
  case $1 in
    --a) A=$2; shift 2 ;;
    --b) B=$2; shift 2 ;;
    --layout) LAYOUT=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --warm) WARM=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$A" ] && [ -x "$B" ] || { echo "--a and --b must name two stria binaries" >&2; exit 2; }
for tool in fio nbdcopy taskset python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
W=$(mktemp -d /dev/shm/stria-ab.XXXXXX)
PID=
stop() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  PID=
}
trap 'stop; rm -rf "$W"' EXIT
head -c 1G /dev/urandom >"$W/fill.img"
HZ=$(getconf CLK_TCK)
one() {
  local bin=$1 tag=$2
  taskset -c 1 "$bin" serve --log-level warn --nbd "unix:$W/nbd.sock" --bench-memory-drives 6x2G \
    --bench-memory-fast-drives 2x2G --bench-volume "v0:$LAYOUT:1G" >"$W/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 200); do [ -S "$W/nbd.sock" ] && break; sleep 0.05; done
  local uri="nbd+unix:///v0?socket=$W/nbd.sock"
  nbdcopy "$W/fill.img" "$uri"
  taskset -c 0 fio --name=w --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 --size=1G \
    --time_based --runtime="$WARM" --output=/dev/null >/dev/null 2>&1
  local t0 t1
  t0=$(awk '{print $14 + $15}' "/proc/$PID/stat")
  taskset -c 0 fio --name=m --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 --size=1G \
    --time_based --runtime="$SECS" --output-format=json >"$W/fio.json"
  t1=$(awk '{print $14 + $15}' "/proc/$PID/stat")
  stop
  rm -f "$W/nbd.sock"
  python3 - "$W/fio.json" "$t0" "$t1" "$HZ" "$SECS" "$tag" <<'PY' | tee -a "$W/runs"
import json, sys
path, t0, t1, hz, secs, tag = sys.argv[1:]
text = open(path).read()
w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
cpu_us = (int(t1) - int(t0)) / int(hz) * 1e6
print(tag, f"{w['iops'] / 1000:.1f}", f"{cpu_us / (w['iops'] * float(secs)):.2f}",
      f"{w['clat_ns']['percentile']['99.000000'] / 1000:.0f}")
PY
}
echo "layout $LAYOUT; run: build kIOPS us_cpu_per_write p99_us"
for _ in $(seq "$REPS"); do one "$A" A; one "$B" B; done
python3 - "$W/runs" <<'PY'
import statistics, sys
runs = [line.split() for line in open(sys.argv[1])]
for tag in "AB":
    mine = [r for r in runs if r[0] == tag]
    med = [statistics.median(float(r[i]) for r in mine) for i in (1, 2, 3)]
    print(f"median {tag}: {med[0]:.1f} kIOPS, {med[1]:.2f} us of server CPU per write, p99 {med[2]:.0f} us")
PY
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
