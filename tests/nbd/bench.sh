#!/bin/bash
# Compare stria-nbd (nbd-mem-server) with `nbdkit memory` under fio's nbd engine.
# Usage: tests/nbd/bench.sh [RUNTIME_SECONDS]   (needs fio, nbdkit, nbdcopy; builds the example)
# fio runs on CPU 0, the server on CPU 1. Both exports are filled with random data first.
# Prints one line per (server, workload, iodepth): kIOPS, p99 completion latency in us, and the
# server's CPU time per I/O in us (utime + stime from /proc; robust against load from elsewhere).
# Both servers and fio run at the same raised priority (NICE, default -10; needs root) so that
# other work on a shared machine disturbs them less. Without it the comparison under load is
# skewed towards nbdkit, whose many threads each get a scheduler share.
set -euo pipefail
RUNTIME=${1:-10}
NICE=${NICE:--10}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-nbd}
cargo build -q --release -p stria-nbd --example nbd-mem-server --manifest-path "$ROOT/Cargo.toml"
BIN=$CARGO_TARGET_DIR/release/examples/nbd-mem-server
W=$(mktemp -d /tmp/nbd-bench.XXXX); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
head -c 1G /dev/urandom > "$W/fill.img"

start_server() { # name -> sets URI_<name>
  case $1 in
    stria) nice -n "$NICE" taskset -c 1 "$BIN" --unix "$W/s.sock" --export bench --size 1G 2>"$W/stria.log" & PIDS+=($!); PID_stria=$!
           URI_stria="nbd+unix:///bench?socket=$W/s.sock"; SOCK=$W/s.sock; URI=$URI_stria ;;
    nbdkit) nice -n "$NICE" taskset -c 1 nbdkit -f -U "$W/k.sock" memory 1G & PIDS+=($!); PID_nbdkit=$!
           URI_nbdkit="nbd+unix:///?socket=$W/k.sock"; SOCK=$W/k.sock; URI=$URI_nbdkit ;;
  esac
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
  nbdcopy "$W/fill.img" "$URI"
}

# Both servers run side by side (idle when not measured) and each workload is measured on one
# right after the other, so load from elsewhere on the machine hits both alike.
start_server nbdkit; start_server stria
sync; sleep 2   # let the fill settle so the first run is not measured against writeback
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
printf '%-10s %4s %-7s %9s %9s %11s\n' workload qd server kIOPS p99_us cpu_us_per_io
order=(nbdkit stria)
for rw in randread randwrite; do
  for qd in 1 16 64; do
    order=("${order[1]}" "${order[0]}")   # alternate who goes first
    for server in "${order[@]}"; do
      uri_var=URI_$server; pid_var=PID_$server
      ticks_before=$(cpu_ticks "${!pid_var}")
      nice -n "$NICE" taskset -c 0 fio --name=b --ioengine=nbd --uri="${!uri_var}" --rw=$rw --bs=4k --iodepth=$qd \
        --size=1G --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json --output="$W/out.json" >/dev/null
      ticks=$(( $(cpu_ticks "${!pid_var}") - ticks_before ))
      /usr/bin/python3 - "$W/out.json" "$server" "$rw" "$qd" "$ticks" "$(getconf CLK_TCK)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); j = d["jobs"][0]; side = "read" if "read" in sys.argv[3] else "write"
s = j[side]; p99 = s["clat_ns"]["percentile"]["99.000000"] / 1000
# CPU ticks also cover the 1 s ramp, so count the I/Os of the ramp too (at the measured rate).
ios = s["total_ios"] + s["iops"] * 1.0
cpu_us = int(sys.argv[5]) * 1e6 / int(sys.argv[6]) / ios
print(f"{sys.argv[3]:<10} {sys.argv[4]:>4} {sys.argv[2]:<7} {s['iops']/1000:9.1f} {p99:9.1f} {cpu_us:11.2f}")
PY
    done
  done
done
