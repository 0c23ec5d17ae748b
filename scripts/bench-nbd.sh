#!/usr/bin/env bash
# NBD benchmark: fio against `stria serve` and against `nbdkit memory` in the same run.
#
# Usage: scripts/bench-nbd.sh [--drives memory|tmpfs] [--reps N] [--runtime S] [--modes "pinned unpinned"]
#                             [--out FILE.json] [--quick] [--only REGEX]
#                             [--serve-args "ARGS"]
#
# What it does (docs/benchmarks.md, section "NBD", explains the choices and lists results):
#  * builds `stria` in release (CARGO_TARGET_DIR, default target/);
#  * stria serves four 1 GiB volumes from 2 fast + 6 capacity memory-backed drives: `r0` (raid0
#    over the 6), `ec` (ec:4+2, checksums on, as always), `tv` (tiered:ec:4+2, `stria-tiered`:
#    thin, log-structured, cache and map on the 2 fast drives) and `lv` (log:ec:4+2,
#    `stria-log`: cache and map mirrored on the capacity drives). `--drives memory` (default)
#    uses the daemon's hidden benchmark options `--bench-memory-drives` and
#    `--bench-memory-fast-drives` (in-process memory drives: the NBD path, the engine, the tier
#    and their checksums, no kernel file I/O underneath); `--drives tmpfs` makes a normal pool of
#    files in /dev/shm (the file drive then runs its calls inline, through the kernel's page
#    cache and each file's inode lock);
#  * the peer is `nbdkit memory 1G`; both are on Unix sockets; stria is restarted (and refilled)
#    for the unpinned phase, because it sizes its runtime by the CPUs it may use at start;
#  * every export is filled with random data first (unwritten blocks would read as zeros
#    without touching any drive);
#  * the fio matrix: 4 KiB random read and write at iodepth 1, 16 and 64, the same at iodepth 1
#    and 16 over 4 connections (`-4c-`: fio's numjobs=4, each job its own connection at that
#    iodepth, IOPS summed), 128 KiB sequential read and write at iodepth 16; each workload is run on every server back to back (the order
#    alternates), `--reps` times, pinned (servers on CPU 1, fio on CPU 0) and unpinned;
#  * prints medians (kIOPS, mean and p99 completion latency in us, GB/s) and stria/nbdkit ratios,
#    and writes every sample (with fio's completion latency percentiles) and the medians to a JSON
#    file (default target/bench-reports/nbd/bench-nbd.json), then runs `stria-report nbd` on it:
#    REPORT.md and PNG plots (IOPS and latency against queue depth, latency CDFs) beside it.
# Servers and fio run at nice -10 (NICE=..., root only) so that other work on a shared machine
# disturbs both sides alike. Takes about 13 minutes with the defaults (--quick: about 1).
# --only REGEX runs the workloads whose name matches (e.g. 'randwrite-4k-qd(1|16)$');
# --serve-args "ARGS" adds flags to `stria serve` (e.g. "--nbd-busy-poll 50").
# STRIA=PATH benchmarks that binary instead of building one (to compare two builds).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DRIVES=memory REPS=3 RUNTIME=2 RAMP=0.5 MODES="pinned unpinned" ONLY=. SERVE_ARGS= OUT=$ROOT/target/bench-reports/nbd/bench-nbd.json
while (($#)); do
  case $1 in
    --drives) DRIVES=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --serve-args) SERVE_ARGS=$2; shift 2 ;;
    --quick) REPS=1 RUNTIME=1 RAMP=0.3 MODES=pinned; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $DRIVES in memory|tmpfs) ;; *) echo "--drives must be memory or tmpfs" >&2; exit 2 ;; esac
for tool in fio nbdkit nbdcopy taskset python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install fio nbdkit libnbd-bin)" >&2; exit 1; }
done
NICE=${NICE:-$([ "$(id -u)" = 0 ] && echo -10 || echo 0)}
CPUS=$(nproc)
((CPUS >= 2)) || { echo "needs at least 2 CPUs (fio on CPU 0, servers on CPU 1)" >&2; exit 1; }

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
echo "building stria (release) in $CARGO_TARGET_DIR ..."
if [ -n "${STRIA:-}" ]; then
  cargo build -q --release -p stria-report --manifest-path "$ROOT/Cargo.toml"
else
  cargo build -q --release -p stria -p stria-report --manifest-path "$ROOT/Cargo.toml"
  STRIA=$CARGO_TARGET_DIR/release/stria
fi
mkdir -p "$(dirname "$OUT")"

W=$(mktemp -d /dev/shm/stria-bench-nbd.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
  rm -rf "$W"
}
trap cleanup EXIT

wait_socket() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# --- servers (nbdkit starts on CPU 1 and the unpinned phase widens its affinity; stria is started
# per phase, because it sizes its runtime by the CPUs it may use when it starts: one thread on one
# CPU, one per CPU otherwise) ---------------------------------------------------------------------
if [ "$DRIVES" = tmpfs ]; then
  "$STRIA" pool create --pool "$W/pool" --fast 2 --capacity 6 --drive-size 2G --log-level warn >/dev/null
  "$STRIA" volume create r0 --pool "$W/pool" --size 1G --layout raid0 --log-level warn >/dev/null
  "$STRIA" volume create ec --pool "$W/pool" --size 1G --layout ec:4+2 --log-level warn >/dev/null
  # Thin, log-structured: cache and map on the fast drives (tiered) or on the capacity drives (log).
  "$STRIA" volume create tv --pool "$W/pool" --size 1G --layout tiered:ec:4+2 --log-level warn >/dev/null
  "$STRIA" volume create lv --pool "$W/pool" --size 1G --layout log:ec:4+2 --log-level warn >/dev/null
fi
STRIA_PID=
start_stria() { # CPU list
  if [ -n "$STRIA_PID" ]; then kill "$STRIA_PID"; wait "$STRIA_PID" 2>/dev/null || true; rm -f "$W/stria.sock"; fi
  if [ "$DRIVES" = memory ]; then
    nice -n "$NICE" taskset -c "$1" "$STRIA" serve --log-level warn --nbd "unix:$W/stria.sock" $SERVE_ARGS \
      --bench-memory-drives 6x2G --bench-memory-fast-drives 2x2G --bench-volume r0:raid0:1G \
      --bench-volume ec:ec:4+2:1G --bench-volume tv:tiered:ec:4+2:1G --bench-volume lv:log:ec:4+2:1G \
      >>"$W/stria.log" 2>&1 &
  else
    nice -n "$NICE" taskset -c "$1" "$STRIA" serve --pool "$W/pool" --log-level warn \
      --nbd "unix:$W/stria.sock" $SERVE_ARGS >>"$W/stria.log" 2>&1 &
  fi
  STRIA_PID=$!; PIDS+=("$STRIA_PID")
  wait_socket "$W/stria.sock"
}
start_stria 1
nice -n "$NICE" taskset -c 1 nbdkit -f -U "$W/nbdkit.sock" memory 1G >"$W/nbdkit.log" 2>&1 &
NBDKIT_PID=$!; PIDS+=("$NBDKIT_PID")
wait_socket "$W/nbdkit.sock"

declare -A URI=(
  [nbdkit]="nbd+unix:///?socket=$W/nbdkit.sock"
  [stria-raid0]="nbd+unix:///r0?socket=$W/stria.sock"
  [stria-ec]="nbd+unix:///ec?socket=$W/stria.sock"
)
URI[stria-tiered]="nbd+unix:///tv?socket=$W/stria.sock"
URI[stria-log]="nbd+unix:///lv?socket=$W/stria.sock"
TARGETS=(nbdkit stria-raid0 stria-ec stria-tiered stria-log)

echo "filling the exports with random data ..."
head -c 1G /dev/urandom >"$W/fill.img"
fill() { for t in "$@"; do nbdcopy "$W/fill.img" "${URI[$t]}"; done; sync; sleep 1; }
fill "${TARGETS[@]}"

# --- the matrix ---------------------------------------------------------------------------------
# name rw bs iodepth [connections]
WORKLOADS=(
  "randread-4k-qd1 randread 4k 1" "randread-4k-qd16 randread 4k 16" "randread-4k-qd64 randread 4k 64"
  "randwrite-4k-qd1 randwrite 4k 1" "randwrite-4k-qd16 randwrite 4k 16" "randwrite-4k-qd64 randwrite 4k 64"
  "randread-4k-4c-qd1 randread 4k 1 4" "randread-4k-4c-qd16 randread 4k 16 4"
  "randwrite-4k-4c-qd1 randwrite 4k 1 4" "randwrite-4k-4c-qd16 randwrite 4k 16 4"
  "seqread-128k-qd16 read 128k 16" "seqwrite-128k-qd16 write 128k 16"
)
KEPT=()
for w in "${WORKLOADS[@]}"; do [[ ${w%% *} =~ $ONLY ]] && KEPT+=("$w"); done
((${#KEPT[@]})) || { echo "--only $ONLY matches no workload" >&2; exit 2; }
WORKLOADS=("${KEPT[@]}")
SAMPLES=$W/samples.tsv; : >"$SAMPLES"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)

set_affinity() { # pinned | unpinned
  local cpus=1; [ "$1" = unpinned ] && cpus=0-$((CPUS - 1))
  taskset -a -p -c "$cpus" "$NBDKIT_PID" >/dev/null
  if [ "$(taskset -p "$STRIA_PID" | awk '{print $NF}')" != "$(taskset -c "$cpus" sh -c 'taskset -p $$' | awk '{print $NF}')" ]; then
    start_stria "$cpus"
    [ "$DRIVES" = memory ] && fill stria-raid0 stria-ec stria-tiered stria-log
  fi
  return 0
}

run_fio() { # mode target rw bs qd json connections
  local pin=(); [ "$1" = pinned ] && pin=(taskset -c 0)
  nice -n "$NICE" "${pin[@]}" fio --name=bench --ioengine=nbd --uri="${URI[$2]}" --rw="$3" --bs="$4" \
    --iodepth="$5" --numjobs="${7:-1}" --size=1G --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --group_reporting \
    --output-format=json --output="$6" >/dev/null
}

total=$(( $(wc -w <<<"$MODES") * REPS * ${#WORKLOADS[@]} * ${#TARGETS[@]} )); n=0; turn=0
for mode in $MODES; do
  set_affinity "$mode"
  for rep in $(seq "$REPS"); do
    for w in "${WORKLOADS[@]}"; do
      read -r name rw bs qd conns <<<"$w"
      # Rotate who goes first so that neither side always runs right after the other.
      k=$((turn % ${#TARGETS[@]})); turn=$((turn + 1))
      order=("${TARGETS[@]:k}" "${TARGETS[@]:0:k}")
      for t in "${order[@]}"; do
        n=$((n + 1))
        printf '\r[%3d/%3d] %-8s rep %d %-20s %-12s' "$n" "$total" "$mode" "$rep" "$name" "$t" >&2
        run_fio "$mode" "$t" "$rw" "$bs" "$qd" "$W/fio.json" "${conns:-1}"
        python3 - "$W/fio.json" "$mode" "$name" "$t" "$rep" "$rw" >>"$SAMPLES" <<'PY'
import json, sys
path, mode, name, target, rep, rw = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
side = job["write" if "write" in rw else "read"]
clat = side["clat_ns"]
pct = {k: v / 1e3 for k, v in clat["percentile"].items()}  # the latency CDF of the report, us
print("\t".join(map(str, [mode, name, target, rep, side["iops"] / 1e3, clat["mean"] / 1e3,
                          clat["percentile"]["99.000000"] / 1e3, side["bw_bytes"] / 1e9, json.dumps(pct)])))
PY
      done
    done
  done
done
printf '\r%60s\r' '' >&2
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report -------------------------------------------------------------------------------------
python3 - "$SAMPLES" "$OUT" "$DRIVES" "$REPS" "$RUNTIME" "$LOAD_START" "$LOAD_END" "$(( $(date +%s) - START ))" \
  "$(fio --version)" "$(nbdkit --version | head -1)" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $CPUS CPUs" <<'PY'
import json, statistics, sys
samples, out, drives, reps, runtime, load0, load1, secs, fio_v, nbdkit_v, rev, cpu = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(samples) if l.strip()]
keys = ["kiops", "mean_us", "p99_us", "gbps"]
groups = {}
pcts = {}
for mode, name, target, rep, *vals in rows:
    groups.setdefault((mode, name, target), []).append([float(v) for v in vals[:4]])
    pcts.setdefault((mode, name, target), []).append(json.loads(vals[4]) if len(vals) > 4 else {})
med = {k: dict(zip(keys, (statistics.median(c) for c in zip(*v)))) for k, v in groups.items()}
modes = list(dict.fromkeys(r[0] for r in rows))
names = list(dict.fromkeys(r[1] for r in rows))
targets = list(dict.fromkeys(r[2] for r in rows))
print(f"\nNBD benchmark on {cpu}: stria ({drives} drives) vs nbdkit memory; medians of {reps} runs of {runtime} s")
print(f"load average {load0} at start, {load1} at end; {secs} s; {fio_v}, {nbdkit_v}, stria {rev}")
result = {"cpu": cpu, "drives": drives, "reps": int(reps), "runtime_s": float(runtime), "load_start": load0,
          "load_end": load1, "fio": fio_v, "nbdkit": nbdkit_v, "stria_rev": rev, "results": []}
for mode in modes:
    print(f"\n{mode}:")
    print(f"{'workload':<20} {'server':<12} {'kIOPS':>8} {'mean_us':>8} {'p99_us':>8} {'GB/s':>7}"
          f" {'x_iops':>7} {'x_p99':>6}")
    for name in names:
        base = med.get((mode, name, "nbdkit"))
        for t in targets:
            m = med.get((mode, name, t))
            if m is None:
                continue
            ratio_iops = m["kiops"] / base["kiops"] if base and t != "nbdkit" else None
            ratio_p99 = m["p99_us"] / base["p99_us"] if base and t != "nbdkit" else None
            fmt = lambda r: f"{r:.2f}" if r is not None else "-"
            print(f"{name:<20} {t:<12} {m['kiops']:8.1f} {m['mean_us']:8.1f} {m['p99_us']:8.1f} "
                  f"{m['gbps']:7.2f} {fmt(ratio_iops):>7} {fmt(ratio_p99):>6}")
            result["results"].append({"mode": mode, "workload": name, "server": t, "median": m,
                                      "ratio_iops_vs_nbdkit": ratio_iops, "ratio_p99_vs_nbdkit": ratio_p99,
                                      "samples": [dict(zip(keys, s), clat_pct_us=p) for s, p in
                                                  zip(groups[(mode, name, t)], pcts[(mode, name, t)])]})
json.dump(result, open(out, "w"), indent=1)
print(f"\nJSON: {out}")
PY
"$CARGO_TARGET_DIR/release/stria-report" nbd "$OUT" --out "$(dirname "$OUT")"
