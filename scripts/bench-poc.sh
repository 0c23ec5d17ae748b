#!/usr/bin/env bash
# Seed 000's PoC tests, scaled to this machine: a tiered volume through NBD (docs/benchmarks.md,
# "Seed 000's PoC tests").
#
# Usage: scripts/bench-poc.sh [--runtime S] [--size SIZE] [--out DIR] [--serve-args "ARGS"]
#
# Seed 000 tested its multi-tiered volume (write cache and map on Optane, 4+2+2 EC on QLC) with
# block-level tests, destage running all the time. The same tests here: `stria serve` over a pool
# of files in /dev/shm (2 fast + 6 capacity drives), one `tiered:ec:4+2` volume (cache and map
# mirrored on the fast drives), filled with random data first, fio's nbd engine on a Unix socket,
# no pinning (fio and the server share the machine's CPUs). Every write test writes more than the
# write cache holds, so destage runs throughout, as in the seed.
#
#   seqwrite-512k-1       one sequential 512 KiB write stream (queue depth 1)
#   seqwrite-512k-4       four sequential 512 KiB write streams (each on its own quarter, qd 4)
#   randread-4k-4         four 4 KiB random read streams (qd 16 each)
#   randread-64k-4        four 64 KiB random read streams (qd 4 each)
#   randread-64k-4-write  the same while one sequential 512 KiB write stream runs
#   readlat-4k            one 4 KiB random read stream at queue depth 1, nothing else
#   readlat-4k-write      the same while one sequential 512 KiB stream writes at 70 % of what
#                         seqwrite-512k-1 reached (the seed: "a write load of over 70 % of maximum")
#
# Prints a table (MB/s, kIOPS, mean and p99 completion latency) and the seed's two ratios: 64 KiB
# read bandwidth under a write stream over alone (the seed: 0.7), and 4 KiB read latency under
# writes over idle (the seed: 1.28; the issue's goal: at most 1.3). Each test's fio JSON goes to
# DIR (default target/bench-reports/poc); then `stria-report fio` writes DIR/REPORT.md and the
# latency CDFs. Needs fio, nbdcopy. Takes about 3 minutes with the defaults.
# --serve-args "ARGS" adds flags to `stria serve` (e.g. "--background-nice 0", to compare).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNTIME=10 SIZE=2G OUT=$ROOT/target/bench-reports/poc SERVE_ARGS=
while (($#)); do
  case $1 in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --serve-args) SERVE_ARGS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in fio nbdcopy python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install fio libnbd-bin)" >&2; exit 1; }
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
echo "building stria and stria-report (release) in $CARGO_TARGET_DIR ..."
cargo build -q --release -p stria -p stria-report --manifest-path "$ROOT/Cargo.toml"
STRIA=$CARGO_TARGET_DIR/release/stria
mkdir -p "$OUT"
rm -f "$OUT"/*.json

W=$(mktemp -d /dev/shm/stria-bench-poc.XXXXXX)
PID=
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT

SIZE_BYTES=$(numfmt --from=iec "$SIZE")
QUARTER=$((SIZE_BYTES / 4))
"$STRIA" pool create --pool "$W/pool" --fast 2 --capacity 6 --drive-size "$SIZE" \
  --log-level warn >/dev/null
"$STRIA" volume create tv --pool "$W/pool" --size "$SIZE" --layout tiered:ec:4+2 --log-level warn >/dev/null
# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
"$STRIA" serve --pool "$W/pool" --log-level warn --nbd "unix:$W/stria.sock" $SERVE_ARGS >"$W/stria.log" 2>&1 &
PID=$!
for _ in $(seq 200); do [ -S "$W/stria.sock" ] && break; sleep 0.05; done
[ -S "$W/stria.sock" ] || { cat "$W/stria.log" >&2; echo "stria did not start" >&2; exit 1; }
URI="nbd+unix:///tv?socket=$W/stria.sock"

echo "filling the volume with random data ..."
head -c "$SIZE_BYTES" /dev/urandom >"$W/fill.img"
nbdcopy "$W/fill.img" "$URI"
rm -f "$W/fill.img"

# fio with the options every job shares, then the jobs (each `--name` starts one).
run() { # test-name, then fio job options
  local name=$1; shift
  printf '%-22s ...\r' "$name" >&2
  fio --ioengine=nbd --uri="$URI" --time_based --runtime="$RUNTIME" --ramp_time=1 \
    --output-format=json --output="$OUT/$name.json" "$@" >/dev/null
}
WRITER=(--name=writer --new_group --rw=write --bs=512k --iodepth=1 --size="$SIZE_BYTES")

run seqwrite-512k-1 --name=w --rw=write --bs=512k --iodepth=1 --size="$SIZE_BYTES"
run seqwrite-512k-4 --name=w --rw=write --bs=512k --iodepth=4 --numjobs=4 --size="$QUARTER" \
  --offset_increment="$QUARTER" --group_reporting
run randread-4k-4 --name=r --rw=randread --bs=4k --iodepth=16 --numjobs=4 --size="$SIZE_BYTES" --group_reporting
run randread-64k-4 --name=r --rw=randread --bs=64k --iodepth=4 --numjobs=4 --size="$SIZE_BYTES" --group_reporting
run randread-64k-4-write --name=r --rw=randread --bs=64k --iodepth=4 --numjobs=4 --size="$SIZE_BYTES" \
  --group_reporting "${WRITER[@]}"
run readlat-4k --name=r --rw=randread --bs=4k --iodepth=1 --size="$SIZE_BYTES"
RATE=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw_bytes"] * 0.7))' \
  "$OUT/seqwrite-512k-1.json")
run readlat-4k-write --name=r --rw=randread --bs=4k --iodepth=1 --size="$SIZE_BYTES" "${WRITER[@]}" --rate="$RATE"
printf '%40s\r' '' >&2

python3 - "$OUT" "$RUNTIME" "$SIZE" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs" \
  "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, os, sys
out, runtime, size, cpu, rev = sys.argv[1:]
tests = ["seqwrite-512k-1", "seqwrite-512k-4", "randread-4k-4", "randread-64k-4", "randread-64k-4-write",
         "readlat-4k", "readlat-4k-write"]
print(f"\nSeed 000's PoC tests on {cpu}: tiered:ec:4+2, {size}, drives in /dev/shm, {runtime} s each, stria {rev}")
print(f"{'test':<22} {'job':<7} {'MB/s':>8} {'kIOPS':>7} {'mean_us':>8} {'p99_us':>8}")
got = {}
for t in tests:
    jobs = json.load(open(os.path.join(out, t + ".json")))["jobs"]
    for j in jobs:
        side = j["write" if j["write"]["total_ios"] else "read"]
        what = "write" if j["write"]["total_ios"] else "read"
        lat = side["clat_ns"]
        p99 = lat.get("percentile", {}).get("99.000000", 0) / 1e3
        got[(t, what)] = (side["bw_bytes"] / 1e6, side["iops"] / 1e3, lat["mean"] / 1e3, p99)
        print(f"{t:<22} {what:<7} {side['bw_bytes'] / 1e6:8.1f} {side['iops'] / 1e3:7.1f} {lat['mean'] / 1e3:8.1f} {p99:8.1f}")
bw = got[("randread-64k-4-write", "read")][0] / got[("randread-64k-4", "read")][0]
lat = got[("readlat-4k-write", "read")][2] / got[("readlat-4k", "read")][2]
p99 = got[("readlat-4k-write", "read")][3] / got[("readlat-4k", "read")][3]
print(f"\n64 KiB read bandwidth under a write stream / alone: {bw:.2f} (seed 000: 0.7)")
print(f"4 KiB read latency under writes / idle: mean {lat:.2f}, p99 {p99:.2f} (seed 000: 1.28; goal <= 1.3)")
print(f"write stream during it: {got[('readlat-4k-write', 'write')][0]:.1f} MB/s "
      f"(70 % of seqwrite-512k-1's {got[('seqwrite-512k-1', 'write')][0]:.1f})")
PY
"$CARGO_TARGET_DIR/release/stria-report" fio --out "$OUT" "$OUT"/*.json
