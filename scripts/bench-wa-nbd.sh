#!/usr/bin/env bash
# Write amplification of a tiered:ec:4+2 volume through NBD: capacity bytes per host byte under
# fio's random 4 KiB writes, for each GC policy on the same writes, in the same run.
#
# Usage: scripts/bench-wa-nbd.sh [--stria BIN] [--volume 4G] [--cache 256M] [--fills 0.6667,0.8]
#                                [--workloads uniform,80/20,zipf] [--gc temperature,greedy]
#                                [--warm 2] [--turns 1] [--qd 16] [--seed 1] [--dir /dev/shm]
#
# For each fill f, workload and policy (docs/benchmarks.md, "Write amplification through NBD"):
#  * a new pool of sparse drive files in --dir (2 fast, 6 capacity), one volume of --volume bytes,
#    `--layout tiered:ec:4+2 --cache-size C --space VOLUME/f --gc POLICY` (a fully written volume
#    fills a fraction f of its segment space), served on a Unix socket;
#  * fio (ioengine=nbd) writes it sequentially (1 MiB, qd 8), then --warm volumes' worth of random
#    4 KiB writes (GC reaches its steady state), then --turns volumes' worth measured;
#  * random writes are truly random (`--norandommap`: each write picks any block, as the issue's
#    "truly uniform" asks) with a fixed seed per phase, so every policy gets the same writes;
#    `80/20` is fio's `random_distribution=zoned:80/20:20/80` (80 % of the writes to a fifth of the
#    volume), `zipf` is `zipf:1.1` (fio scatters the ranks over the volume);
#  * the measured phase's capacity bytes per host byte: the growth of the volume's segment part's
#    member writes (data and parity, what the part wrote to the capacity drives) over the growth of
#    its host write bytes (`volume show --json`). The cache is not emptied at the phase's ends: in
#    the steady state it holds as much at the end as at the start;
#  * prints a table: each policy beside greedy, and greedy's limit for uniform writes
#    ((1 - x) / (-ln x) = f, times 1.5 for ec:4+2).
# Needs fio (with its nbd engine) and python3. About 3-4 minutes per (fill, workload, policy) for a
# 4 GiB volume on the 2-CPU machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STRIA=$ROOT/target/release/stria VOLUME=4G CACHE=256M FILLS=0.6667,0.8 WORKLOADS=uniform,80/20,zipf
POLICIES=temperature,greedy WARM=2 TURNS=1 QD=16 SEED=1 DIR=/dev/shm
while (($#)); do
  case $1 in
    --stria) STRIA=$2; shift 2 ;;
    --volume) VOLUME=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --fills) FILLS=$2; shift 2 ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    --gc) POLICIES=$2; shift 2 ;;
    --warm) WARM=$2; shift 2 ;;
    --turns) TURNS=$2; shift 2 ;;
    --qd) QD=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$STRIA" ] || { echo "no stria binary at $STRIA (cargo build --release -p stria)" >&2; exit 2; }
for tool in fio python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install fio python3)" >&2; exit 1; }
done
PY=$(command -v python3)

bytes() { # 4G, 256M, 512K or a number of bytes
  "$PY" -c 'import sys; s = sys.argv[1].upper(); u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
print(int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s))' "$1"
}
VOL_BYTES=$(bytes "$VOLUME")
CACHE_BYTES=$(bytes "$CACHE")

W=
SERVE_PID=
cleanup() {
  if [ -n "$SERVE_PID" ]; then
    kill "$SERVE_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
    SERVE_PID=
  fi
  [ -z "$W" ] || rm -rf "$W"
  W=
}
trap cleanup EXIT

# The volume's host write bytes and its segment part's member write bytes.
counters() {
  "$STRIA" --pool "$W/pool" --log-level warn volume show v --json | "$PY" -c 'import json, sys
v = json.load(sys.stdin)
seg = [p for p in v["parts"] if p["role"] == "seg"][0]
print(v["host_write_bytes"], seg["member_write_bytes"], v.get("destage_hot_batches", 0), v["gc_moved_blocks"], v["gc"])'
}

# fio on the served volume: name, then fio options.
fio_run() {
  local name=$1; shift
  fio --name="$name" --ioengine=nbd --uri="nbd+unix:///v?socket=$W/sock" --size="$VOL_BYTES" \
    --output-format=json "$@" >"$W/fio.$name.json" \
    || { echo "fio $name failed:" >&2; cat "$W/fio.$name.json" >&2; tail -20 "$W/serve.log" >&2; exit 1; }
  # fio's nbd engine prints a line of its own before the JSON.
  "$PY" -c 'import json, sys; t = open(sys.argv[1]).read(); j = json.loads(t[t.index("{"):])
print("%.0f" % j["jobs"][0]["write"]["iops"])' "$W/fio.$name.json"
}

# One run: fill, workload, policy; sets RESULT to "cost hot_batches gc_moved iops" (not run in a
# subshell, so that the trap stops its server if it fails).
run_one() {
  local fill=$1 workload=$2 policy=$3
  W=$(mktemp -d "$DIR/stria-wa-nbd.XXXXXX")
  local space drive
  space=$("$PY" -c "print(int($VOL_BYTES / $fill) // 4096 * 4096)")
  # Capacity drives hold a sixth of the segment space each (ec:4+2: a quarter of its data and
  # parity over six drives is space / 4), fast drives the cache and the map; sparse files.
  drive=$("$PY" -c "print(max($space // 4 + (768 << 20), 2 * $CACHE_BYTES + (1 << 30)) >> 20)")
  "$STRIA" pool create --pool "$W/pool" --fast 2 --capacity 6 --drive-size "${drive}M" --log-level warn >/dev/null 2>&1
  "$STRIA" volume create v --pool "$W/pool" --size "$VOL_BYTES" --layout tiered:ec:4+2 \
    --cache-size "$CACHE_BYTES" --space "$space" --gc "$policy" --log-level warn >/dev/null
  "$STRIA" serve --pool "$W/pool" --log-level warn --nbd "unix:$W/sock" >"$W/serve.log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 300); do [ -S "$W/sock" ] && break; sleep 0.1; done
  [ -S "$W/sock" ] || { echo "stria serve did not start:" >&2; cat "$W/serve.log" >&2; exit 1; }
  local dist=()
  case $workload in
    uniform) ;;
    80/20) dist=(--random_distribution=zoned:80/20:20/80) ;;
    zipf) dist=(--random_distribution=zipf:1.1) ;;
    *) echo "unknown workload $workload (uniform, 80/20, zipf)" >&2; exit 2 ;;
  esac
  local random=(--rw=randwrite --bs=4k --iodepth="$QD" --norandommap --randrepeat=0 "${dist[@]}")
  fio_run fill --rw=write --bs=1M --iodepth=8 >/dev/null
  fio_run warm "${random[@]}" --randseed="$SEED" --io_size="$("$PY" -c "print(int($VOL_BYTES * $WARM) // 4096 * 4096)")" >/dev/null
  local before after iops
  before=$(counters)
  iops=$(fio_run measured "${random[@]}" --randseed="$((SEED + 1))" \
    --io_size="$("$PY" -c "print(int($VOL_BYTES * $TURNS) // 4096 * 4096)")")
  after=$(counters)
  RESULT=$("$PY" -c 'import sys
b, a = sys.argv[1].split(), sys.argv[2].split()
host, seg = int(a[0]) - int(b[0]), int(a[1]) - int(b[1])
assert a[4] == sys.argv[3], "the volume runs GC policy %s, not %s" % (a[4], sys.argv[3])
print("%.3f %d %d %s" % (seg / host, int(a[2]) - int(b[2]), int(a[3]) - int(b[3]), sys.argv[4]))' \
    "$before" "$after" "$policy" "$iops")
  cleanup
}

echo "bench-wa-nbd: stria $("$STRIA" --version 2>/dev/null | head -1), $(fio --version), on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
echo "volume $VOLUME tiered:ec:4+2, cache $CACHE, warm-up $WARM and measured $TURNS volumes of random 4 KiB writes at qd $QD, drive files in $DIR"
RESULTS=()
IFS=, read -ra fills <<<"$FILLS"
IFS=, read -ra workloads <<<"$WORKLOADS"
IFS=, read -ra policies <<<"$POLICIES"
for fill in "${fills[@]}"; do
  for workload in "${workloads[@]}"; do
    for policy in "${policies[@]}"; do
      t0=$(date +%s)
      run_one "$fill" "$workload" "$policy"
      read -r cost hot moved iops <<<"$RESULT"
      echo "fill $fill, $workload, GC $policy: $cost capacity bytes per host byte (measured phase; $moved blocks moved by GC, $hot hot destage batches, $iops IOPS; $(($(date +%s) - t0)) s)"
      RESULTS+=("$fill $workload $policy $cost")
    done
  done
done
echo
echo "measured phase, capacity bytes per host byte (segment part's member writes):"
printf '%s\n' "${RESULTS[@]}" | "$PY" -c 'import math, sys
rows = [l.split() for l in sys.stdin if l.strip()]
def limit(f):
    # (1 - x) / (-ln x) = f, solved for x by bisection; greedy writes 1 / (1 - x) per host byte.
    lo, hi = 1e-9, 1 - 1e-9
    for _ in range(100):
        x = (lo + hi) / 2
        if (1 - x) / -math.log(x) < f: lo = x
        else: hi = x
    return 1.5 / (1 - x)
greedy = {(f, w): float(c) for f, w, p, c in rows if p == "greedy"}
print("| fill | workload | policy | cost | / greedy | greedy limit (uniform) |")
print("|---|---|---|---:|---:|---:|")
for f, w, p, c in rows:
    g = greedy.get((f, w))
    ratio = "%.2f" % (float(c) / g) if g else "-"
    lim = "%.2f (%.3fx)" % (limit(float(f)), float(c) / limit(float(f))) if w == "uniform" else ""
    print("| %.1f %% | %s | %s | %s | %s | %s |" % (100 * float(f), w, p, c, ratio, lim))'
