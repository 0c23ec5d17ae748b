#!/usr/bin/env bash
# Disk benchmark: `stria serve` over drive files on a real filesystem (O_DIRECT, io_uring), with
# and without rings of the thread, against the same disk read and written raw, in the same run.
#
# Usage: scripts/bench-disk.sh [--dir DIR] [--reps N] [--runtime S] [--modes "pinned unpinned"]
#                              [--volumes "r0 ec tv lv tvb lvb"] [--only REGEX] [--out FILE.tsv]
#                              [--fast-dir DIR] [--snapshot]
#
# What it does (docs/benchmarks.md, "Drives on a disk", explains the choices and lists results):
#  * builds `stria` in release (or uses STRIA=PATH);
#  * makes, under DIR (default /var/tmp; refused on tmpfs, where drive files run their calls
#    inline and no ring is used), a pool of 2 fast + 6 capacity drive files of 2 GiB and four
#    1 GiB volumes: `r0` (raid0 over the 6), `ec` (ec:4+2), `tv` (tiered:ec:4+2) and `lv`
#    (log:ec:4+2), filled with random data through NBD; and six raw files of 1 GiB, filled;
#    `--volumes` picks among them and two more made only when named: `tvb` and `lvb`, the same
#    thin volumes with `--cache-mode write-back` (docs/operations.md);
#    `--fast-dir DIR` puts the two fast drive files in DIR instead (/dev/shm: what a tiered
#    volume's writes cost when its cache and map cost nothing, docs/benchmarks.md);
#    `--snapshot` takes a snapshot of each thin volume after the fill (its writes then preserve
#    map pages for it, and keep what the snapshot holds; thin volumes then get `--space 3G`,
#    room for the snapshot's data and the head's new data);
#  * the reference, `raw`: fio's io_uring engine with O_DIRECT on the six raw files (one job,
#    requests spread over the files: the disk with no NBD, no engine, no checksums);
#  * `thread`: stria as it runs by default (a connection's drive calls on its thread's own
#    io_uring, crates/dev/src/file/local.rs); `drive`: the same binary with STRIA_THREAD_RINGS=0
#    (every call on the drive's own ring, reaped by the drive's completion thread), which is how
#    stria ran before rings of the thread;
#  * workloads: 4 KiB random read and write at iodepth 1 and 16 (fio's nbd engine, one
#    connection); per rep the two stria variants run in alternating order, each started fresh;
#    pinned: the server on CPU 1 and fio on CPU 0 (the server then runs one current-thread
#    runtime); unpinned: both may use every CPU (one connection thread per CPU);
#  * prints medians (kIOPS, p99 completion latency in us, server CPU time per request in us) and
#    each variant's ratio to raw, and writes every sample to a TSV file (default
#    target/bench-reports/disk/bench-disk.tsv).
# About 2 minutes per rep and mode with the defaults (reps 3, both modes: about 12 minutes).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=/var/tmp FAST_DIR= SNAPSHOT= REPS=3 RUNTIME=3 RAMP=0.5 MODES="pinned unpinned" VOLUMES="r0 ec tv lv" ONLY=.
OUT=$ROOT/target/bench-reports/disk/bench-disk.tsv
while (($#)); do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --volumes) VOLUMES=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --fast-dir) FAST_DIR=$2; shift 2 ;;
    --snapshot) SNAPSHOT=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in fio nbdcopy taskset python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install fio libnbd-bin)" >&2; exit 1; }
done
[ "$(stat -f -c %T "$DIR")" != tmpfs ] || { echo "$DIR is on tmpfs: give --dir a directory on a disk" >&2; exit 2; }
CPUS=$(nproc)
((CPUS >= 2)) || { echo "needs at least 2 CPUs (fio on CPU 0, the server on CPU 1)" >&2; exit 1; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${STRIA:-}" ]; then
  echo "building stria (release) in $CARGO_TARGET_DIR ..."
  cargo build -q --release -p stria --manifest-path "$ROOT/Cargo.toml"
  STRIA=$CARGO_TARGET_DIR/release/stria
fi
mkdir -p "$(dirname "$OUT")"
layout_of() { # volume -> volume create arguments
  case $1 in
    r0) echo "--layout raid0" ;;
    ec) echo "--layout ec:4+2" ;;
    tv) echo "--layout tiered:ec:4+2" ;;
    lv) echo "--layout log:ec:4+2" ;;
    tvb) echo "--layout tiered:ec:4+2 --cache-mode write-back" ;;
    lvb) echo "--layout log:ec:4+2 --cache-mode write-back" ;;
    *) echo "unknown volume $1 (r0 ec tv lv tvb lvb)" >&2; return 2 ;;
  esac
}
for v in $VOLUMES; do layout_of "$v" >/dev/null || exit 2; done

W=$(mktemp -d "$DIR/stria-bench-disk.XXXXXX")
SERVER=
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$W" ${F:+"$F"}
}
trap cleanup EXIT

echo "making the pool and the raw files in $W ($(stat -f -c %T "$DIR")) ..."
FAST=(--fast 2)
if [ -n "$FAST_DIR" ]; then
  F=$(mktemp -d "$FAST_DIR/stria-bench-disk-fast.XXXXXX")
  FAST=(--drive "fast:$F/fast-0.img" --drive "fast:$F/fast-1.img")
  truncate -s 2G "$F/fast-0.img" "$F/fast-1.img"
  echo "the fast drives in $F ($(stat -f -c %T "$FAST_DIR"))"
fi
"$STRIA" pool create --pool "$W/pool" "${FAST[@]}" --capacity 6 --drive-size 2G --log-level warn >/dev/null
for v in $VOLUMES; do
  space=()
  [[ -z $SNAPSHOT || $v == r0 || $v == ec ]] || space=(--space 3G)
  # shellcheck disable=SC2046 # the layout's words
  "$STRIA" volume create "$v" --pool "$W/pool" --size 1G $(layout_of "$v") "${space[@]}" --log-level warn >/dev/null
done
mkdir "$W/raw"
RAW_FILES=
for i in 1 2 3 4 5 6; do
  dd if=/dev/urandom of="$W/raw/r$i" bs=1M count=1024 oflag=direct status=none
  RAW_FILES+="${RAW_FILES:+:}$W/raw/r$i"
done

start_server() { # variant cpus
  local rings=1; [ "$1" = drive ] && rings=0
  STRIA_THREAD_RINGS=$rings taskset -c "$2" "$STRIA" serve --pool "$W/pool" --log-level warn \
    --nbd "unix:$W/s.sock" >>"$W/serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 200); do [ -S "$W/s.sock" ] && return 0; sleep 0.05; done
  echo "the server did not start; its log:" >&2; cat "$W/serve.log" >&2; exit 1
}
stop_server() {
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=; rm -f "$W/s.sock"
}

echo "filling the volumes with random data ..."
head -c 1G /dev/urandom >"$W/fill.img"
start_server thread 0-$((CPUS - 1))
for v in $VOLUMES; do nbdcopy "$W/fill.img" "nbd+unix:///$v?socket=$W/s.sock"; done
stop_server
if [ -n "$SNAPSHOT" ]; then
  for v in $VOLUMES; do
    case $v in tv | tvb | lv | lvb) "$STRIA" snapshot create "$v" filled --pool "$W/pool" --log-level warn >/dev/null ;; esac
  done
fi
rm -f "$W/fill.img"

WORKLOADS=("randread-4k-qd1 randread 1" "randread-4k-qd16 randread 16" "randwrite-4k-qd1 randwrite 1"
  "randwrite-4k-qd16 randwrite 16")
KEPT=()
for w in "${WORKLOADS[@]}"; do [[ ${w%% *} =~ $ONLY ]] && KEPT+=("$w"); done
((${#KEPT[@]})) || { echo "--only $ONLY matches no workload" >&2; exit 2; }
WORKLOADS=("${KEPT[@]}")
: >"$OUT"

# One fio run; appends "mode variant volume workload rep kiops p99_us cpu_us_per_request".
measure() { # mode variant volume workload rw qd rep fio-cpus
  local target
  if [ "$2" = raw ]; then
    target=(--ioengine=io_uring --direct=1 "--filename=$RAW_FILES")
  else
    target=(--ioengine=nbd "--uri=nbd+unix:///$3?socket=$W/s.sock")
  fi
  local c0=0 c1=0
  [ -n "$SERVER" ] && c0=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
  taskset -c "$8" fio --name=bench "${target[@]}" --rw="$5" --bs=4k --iodepth="$6" --size=1G \
    --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --output-format=json --output="$W/fio.json" >/dev/null 2>&1
  [ -n "$SERVER" ] && c1=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
  python3 - "$W/fio.json" "$@" "$c0" "$c1" "$(getconf CLK_TCK)" >>"$OUT" <<'PY'
import json, sys
path, mode, variant, volume, workload, rw, qd, rep, cpus, c0, c1, hz = sys.argv[1:]
side = json.load(open(path))["jobs"][0]["write" if "write" in rw else "read"]
ios = max(side["total_ios"], 1)
cpu_us = (int(c1) - int(c0)) / int(hz) * 1e6 / ios if variant != "raw" else 0.0
print("\t".join(map(str, [mode, variant, volume, workload, rep, side["iops"] / 1e3,
                          side["clat_ns"]["percentile"]["99.000000"] / 1e3, cpu_us])))
PY
}

START=$(date +%s)
for mode in $MODES; do
  scpu=1 fcpu=0
  [ "$mode" = unpinned ] && scpu=0-$((CPUS - 1)) fcpu=0-$((CPUS - 1))
  for rep in $(seq "$REPS"); do
    variants=(thread drive); ((rep % 2)) || variants=(drive thread)
    for w in "${WORKLOADS[@]}"; do
      read -r name rw qd <<<"$w"
      printf '\r%-8s rep %d/%d %-18s raw         ' "$mode" "$rep" "$REPS" "$name" >&2
      measure "$mode" raw raw "$name" "$rw" "$qd" "$rep" "$fcpu"
    done
    for variant in "${variants[@]}"; do
      start_server "$variant" "$scpu"
      for v in $VOLUMES; do
        for w in "${WORKLOADS[@]}"; do
          read -r name rw qd <<<"$w"
          printf '\r%-8s rep %d/%d %-18s %-6s %-3s ' "$mode" "$rep" "$REPS" "$name" "$variant" "$v" >&2
          measure "$mode" "$variant" "$v" "$name" "$rw" "$qd" "$rep" "$fcpu"
        done
      done
      stop_server
    done
  done
done
printf '\r%70s\r' '' >&2
[ -z "$SNAPSHOT" ] || echo "(--snapshot: each thin volume had a snapshot, taken after the fill)"

python3 - "$OUT" "$REPS" "$RUNTIME" "$(( $(date +%s) - START ))" "$DIR ($(stat -f -c %T "$DIR"))" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $CPUS CPUs" \
  "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import statistics, sys
out, reps, runtime, secs, where, cpu, rev = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(out) if l.strip()]
med = {}
for mode, variant, volume, workload, rep, kiops, p99, cpu_us in rows:
    med.setdefault((mode, variant, volume, workload), []).append((float(kiops), float(p99), float(cpu_us)))
med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in med.items()}
print(f"stria over drive files on {where}; {cpu}; build {rev}; {reps} reps of {runtime} s, {secs} s in all")
print("medians: kIOPS (p99 us) [server CPU us per request]; ratio to raw")
modes = sorted({k[0] for k in med}, reverse=True)
workloads = sorted({k[3] for k in med})
volumes = [v for v in ("r0", "ec", "tv", "tvb", "lv", "lvb") if any(k[2] == v for k in med)]
for mode in modes:
    print(f"\n{mode}")
    print(f"{'workload':<18} {'vol':<4} {'raw':>16} {'drive rings':>32} {'thread rings':>32} {'thread/drive':>12}")
    for w in workloads:
        raw = med.get((mode, "raw", "raw", w))
        for v in volumes:
            d, t = med.get((mode, "drive", v, w)), med.get((mode, "thread", v, w))
            if not (raw and d and t):
                continue
            cell = lambda m: f"{m[0]:7.1f} ({m[1]:5.0f}) [{m[2]:5.2f}] {m[0] / raw[0]:4.2f}x"
            print(f"{w:<18} {v:<4} {raw[0]:8.1f} ({raw[1]:5.0f}) {cell(d):>32} {cell(t):>32} {t[0] / d[0]:11.2f}x")
PY
