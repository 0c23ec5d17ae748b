#!/usr/bin/env bash
# Where a 4 KiB read and a 4 KiB write spend the server's CPU (docs/design/datapath.md, "Profile").
#
# Usage: scripts/profile-datapath.sh [--seconds S] [--layouts "raid0 ec:4+2 tiered:ec:4+2"] [--out DIR]
#                                    [--drives tmpfs|memory] [--warm S]
#
# `stria serve` (release build, with debug info) runs pinned on CPU 1 over a pool of files in
# /dev/shm (2 fast + 6 capacity drives; `--drives memory`: the same pool of in-process memory
# drives, `--bench-memory-drives`, so that no kernel file I/O is in the profile); each volume is
# filled with random data (and with `--warm S` written at random for S seconds more, unmeasured,
# so that a thin volume's segment space is all touched and GC runs: memory drives allocate their
# pages at the first write), then fio (nbd
# engine, pinned on CPU 0) runs 4 KiB random writes and then random reads at queue depth 16 while
# `perf record -g` samples the server. For each run it writes `perf report` (self time by symbol)
# to DIR/<layout>-<rw>.txt and prints a table: IOPS, server CPU per request (from the process's
# CPU time), and the share of samples in each part of the path (kernel, socket and NBD, engine,
# tier, checksums, erasure code, copies, allocator, runtime), classified by symbol name.
# Needs root (perf), fio, nbdcopy, perf. Takes about 2 minutes with the defaults.
# STRIA=PATH profiles that binary instead of building one (to compare two builds back to back).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_RUN=8 LAYOUTS="raid0 ec:4+2 tiered:ec:4+2" OUT=$ROOT/target/profile DRIVES=tmpfs WARM=0
while (($#)); do
  case $1 in
    --seconds) SECONDS_RUN=$2; shift 2 ;;
    --layouts) LAYOUTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --drives) DRIVES=$2; shift 2 ;;
    --warm) WARM=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $DRIVES in memory|tmpfs) ;; *) echo "--drives must be tmpfs or memory" >&2; exit 2 ;; esac
for tool in fio nbdcopy perf python3 taskset; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${STRIA:-}" ]; then
  cargo build -q --release -p stria --manifest-path "$ROOT/Cargo.toml"
  STRIA=$CARGO_TARGET_DIR/release/stria
fi
mkdir -p "$OUT"
W=$(mktemp -d /dev/shm/stria-profile.XXXXXX)
PID=
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT

[ "$DRIVES" = tmpfs ] && "$STRIA" pool create --pool "$W/pool" --fast 2 --capacity 6 --drive-size 2G --log-level warn >/dev/null
i=0
declare -A NAME
MEMORY_ARGS=(--bench-memory-drives 6x2G --bench-memory-fast-drives 2x2G)
for l in $LAYOUTS; do
  NAME[$l]=v$i; i=$((i + 1))
  if [ "$DRIVES" = tmpfs ]; then
    "$STRIA" volume create "${NAME[$l]}" --pool "$W/pool" --size 1G --layout "$l" --log-level warn >/dev/null
  else
    MEMORY_ARGS+=(--bench-volume "${NAME[$l]}:$l:1G")
  fi
done
if [ "$DRIVES" = tmpfs ]; then
  taskset -c 1 "$STRIA" serve --pool "$W/pool" --log-level warn --nbd "unix:$W/nbd.sock" >"$W/serve.log" 2>&1 &
else
  taskset -c 1 "$STRIA" serve --log-level warn --nbd "unix:$W/nbd.sock" "${MEMORY_ARGS[@]}" >"$W/serve.log" 2>&1 &
fi
PID=$!
for _ in $(seq 200); do [ -S "$W/nbd.sock" ] && break; sleep 0.05; done
head -c 1G /dev/urandom >"$W/fill.img"
for l in $LAYOUTS; do
  nbdcopy "$W/fill.img" "nbd+unix:///${NAME[$l]}?socket=$W/nbd.sock"
  if [ "$WARM" != 0 ]; then
    taskset -c 0 fio --name=w --ioengine=nbd --uri="nbd+unix:///${NAME[$l]}?socket=$W/nbd.sock" --rw=randwrite \
      --bs=4k --iodepth=16 --size=1G --time_based --runtime="$WARM" --output=/dev/null >/dev/null 2>&1
  fi
done
rm -f "$W/fill.img"; sleep 2

cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
HZ=$(getconf CLK_TCK)
printf '%s\n' "layout rw kiops us_cpu_per_req kernel socket_nbd engine tier crc ec copy alloc runtime other" >"$OUT/summary.tsv"
for l in $LAYOUTS; do
  for rw in randwrite randread; do
    tag="${l//[:+]/-}-$rw"
    t0=$(cpu_ticks)
    perf record -q -F 1999 -g -p "$PID" -o "$W/perf.data" -- sleep "$SECONDS_RUN" 2>/dev/null &
    PERF=$!
    taskset -c 0 fio --name=p --ioengine=nbd --uri="nbd+unix:///${NAME[$l]}?socket=$W/nbd.sock" --rw="$rw" \
      --bs=4k --iodepth=16 --size=1G --time_based --runtime="$SECONDS_RUN" --output-format=json >"$W/fio.json" 2>"$W/fio.err" || { cat "$W/fio.err" "$W/serve.log" >&2; exit 1; }
    wait "$PERF" || true
    t1=$(cpu_ticks)
    perf report -i "$W/perf.data" --no-children --sort sym --stdio --percent-limit 0.3 2>/dev/null \
      | grep -v '^$' >"$OUT/$tag.txt" || true
    perf report -i "$W/perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null \
      | grep -E '^ +[0-9.]+%' >"$W/all.txt" || true
    # Who calls the three busiest kernel symbols (the user-space frames that lead there).
    for sym in $(grep -F '[k]' "$W/all.txt" | head -3 | awk '{print $NF}'); do
      echo "==== $sym"
      perf report -i "$W/perf.data" --no-children --symbols "$sym" -g caller,2,callee,function,percent --stdio 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -60
    done >"$OUT/$tag-kernel-callers.txt"
    python3 - "$W/fio.json" "$W/all.txt" "$l" "$rw" "$t0" "$t1" "$HZ" "$SECONDS_RUN" >>"$OUT/summary.tsv" <<'EOF'
import json, re, sys
fio, rows, layout, rw, t0, t1, hz, secs = sys.argv[1:]
text = open(fio).read()
job = json.loads(text[text.index("{"):])["jobs"][0]  # fio's nbd engine prints a line first
iops = job["read" if rw == "randread" else "write"]["iops"]
cpu_us = (int(t1) - int(t0)) / int(hz) * 1e6
per_req = cpu_us / (iops * float(secs)) if iops else 0
cats = {k: 0.0 for k in "kernel socket_nbd engine tier crc ec copy alloc runtime other".split()}
for line in open(rows):
    m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
    s = sym.lower()
    if "crc32" in s:
        c = "crc"
    elif kind == "k" or dso.startswith("[kernel"):
        c = "kernel"
    elif "memcpy" in s or "memmove" in s or "memset" in s:
        c = "copy"
    elif "malloc" in s or "free" in s or "realloc" in s or "alloc::" in s or "cfree" in s:
        c = "alloc"
    elif "stria_ec" in s or "gf_" in s or "isal" in s:
        c = "ec"
    elif "stria_tier" in s:
        c = "tier"
    elif "stria_nbd" in s or "tokio::net" in s or "recv" in s or "send" in s:
        c = "socket_nbd"
    elif "stria_engine" in s or "stria_dev" in s or "io_uring" in s:
        c = "engine"
    elif "tokio" in s or "parking_lot" in s or "futures" in s or "std::sync" in s or "std::thread" in s:
        c = "runtime"
    else:
        c = "other"
    cats[c] += pct
print(layout, rw, f"{iops / 1000:.1f}", f"{per_req:.1f}", *(f"{v:.0f}" for v in cats.values()))
EOF
    rm -f "$W/perf.data"
  done
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), drives: $DRIVES"
column -t "$OUT/summary.tsv"
echo "(percent of the server's samples; reports by symbol in $OUT)"
