#!/bin/bash
# Per-volume QoS (docs/design/qos.md, "Measured"): reservations, limits and weights through NBD
# with fio, against the issue's goals, and what the dispatcher costs when nothing binds.
#
#   scripts/bench-qos.sh [--stria BIN] [--runtime 10] [--reps 3] [--dir /dev/shm] [--layout ec:4+2]
#
# A pool of 2 fast + 6 capacity sparse drive files in DIR (tmpfs by default), `pool calibrate`,
# and four volumes of LAYOUT, 1 GiB each, filled first: `flood`, `res`, `w1`, `w2`. Every number
# is the median of REPS fio runs of RUNTIME seconds (ioengine=nbd, 4 KiB random writes unless
# said), with the runs of each rep printed in brackets:
#   * alone: `res` at qd 16 and `flood` at qd 64, each on its own;
#   * reservation: `flood` (qd 64) and `res` (qd 16) at once, first without settings, then with
#     `res --iops-reserve R` (R: half of what `res` got alone, halved until admission takes it):
#     what `res` got over R (goal >= 0.90); then the same while a drive rebuilds (5 s runs);
#   * limits: `flood` alone with `--iops-limit` a quarter of what it got alone (goal: within
#     5 %), and with `--bw-limit 16M` at 64 KiB writes;
#   * weights: `w1` (weight 300) and `w2` (weight 100) at qd 32 each: the split (goal: 3 within
#     10 %);
#   * cost: `res` 4 KiB random reads at qd 16 with no setting in the pool (the dispatcher is off)
#     and with a weight on another volume (on: every request is scheduled; nothing binds).
# Needs fio and nbdinfo (scripts/test.sh installs both). Everything it makes is removed at exit.
set -euo pipefail

STRIA=target/release/stria RUNTIME=10 REPS=3 DIR=/dev/shm LAYOUT=ec:4+2
while [ $# -gt 0 ]; do
  case "$1" in
    --stria) STRIA=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --layout) LAYOUT=$2; shift 2 ;;
    *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$STRIA" ] || { echo "no stria binary at $STRIA (cargo build --release -p stria)" >&2; exit 2; }

POOL=$(mktemp -d "$DIR/stria-qosbench.XXXX")
SOCK="$POOL.sock"
JOBS="$POOL.fio"
SERVE_PID=
cleanup() {
  [ -n "$SERVE_PID" ] && kill -9 "$SERVE_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$POOL" "$SOCK" "$JOBS"
}
trap cleanup EXIT

st() { "$STRIA" --pool "$POOL" --log-level warn "$@" 2> >(grep -v 'sparse drive file' >&2); }
uri() { echo "nbd+unix:///$1?socket=$SOCK"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# run JOB...: runs the jobs ("VOLUME RW BS QD") at once for RUNTIME s; prints each one's IOPS
# and bytes per second ("iops:bps") on a line, in order.
run() {
  {
    printf '[global]\nioengine=nbd\ntime_based=1\nruntime=%s\nnorandommap=1\nrandrepeat=0\n' "$RUNTIME"
    for job in "$@"; do
      read -r vol rw bs qd <<<"$job"
      printf '[%s]\nuri=%s\nrw=%s\nbs=%s\niodepth=%s\n' "$vol" "$(uri "$vol")" "$rw" "$bs" "$qd"
    done
  } >"$JOBS"
  fio --output-format=json "$JOBS" 2>/dev/null | python3 -c '
import json, sys
t = sys.stdin.read()
for j in json.loads(t[t.index("{"):])["jobs"]:
    io = j["write"] if j["write"]["iops"] > 0 else j["read"]
    print("%d:%d" % (round(io["iops"]), io["bw_bytes"]), end=" ")
print()'
}

# reps LABEL FIELD JOB...: REPS runs; prints the median of job FIELD (1-based) IOPS with the runs.
declare -A RUNS
reps() {
  local label=$1; shift
  local out=()
  for _ in $(seq "$REPS"); do out+=("$(run "$@")"); done
  RUNS[$label]="${out[*]}"
}
# pick LABEL K [bps]: the median of job K's IOPS (or bytes/s) over the reps of LABEL.
pick() {
  local values=(${RUNS[$1]}) per i f=1
  [ "${3:-}" = bps ] && f=2
  per=$(( ${#values[@]} / REPS ))
  for ((i = $2 - 1; i < ${#values[@]}; i += per)); do cut -d: -f$f <<<"${values[$i]}"; done | median
}
all() {  # all LABEL K: job K's IOPS of every rep
  local values=(${RUNS[$1]}) per i out=()
  per=$(( ${#values[@]} / REPS ))
  for ((i = $2 - 1; i < ${#values[@]}; i += per)); do out+=("$(cut -d: -f1 <<<"${values[$i]}")"); done
  echo "${out[*]}"
}
ratio() { python3 -c "print('%.3f' % ($1 / $2))"; }

echo "bench-qos on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
echo "pool: 2 fast + 6 capacity sparse drives in $DIR; volumes flood, res, w1, w2: 1 GiB $LAYOUT; median of $REPS x ${RUNTIME} s"
st pool create --fast 2 --capacity 6 --drive-size 8G >/dev/null
for v in flood res w1 w2; do st volume create "$v" --size 1G --layout "$LAYOUT" >/dev/null; done
"$STRIA" --pool "$POOL" --log-level warn serve --nbd "unix:$SOCK" >/dev/null 2>&1 &
SERVE_PID=$!
for _ in $(seq 600); do nbdinfo --size "$(uri res)" >/dev/null 2>&1 && break; sleep 0.1; done
for v in flood res w1 w2; do
  fio --name=fill --ioengine=nbd --uri="$(uri "$v")" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
done
echo "calibration (pool calibrate, through the engine, no NBD):"
st pool calibrate | sed 's/^/  /'

# The cost of the dispatcher when nothing binds (first: the pool has no setting yet).
reps off "res randread 4k 16"
st volume set w2 --weight 100 >/dev/null
reps on "res randread 4k 16"
st volume set w2 --weight none >/dev/null
printf 'dispatcher cost, res 4 KiB random reads qd 16: off %s IOPS [%s], on (nothing binds) %s IOPS [%s]: on/off = %s\n' \
  "$(pick off 1)" "$(all off 1)" "$(pick on 1)" "$(all on 1)" "$(ratio "$(pick on 1)" "$(pick off 1)")"

reps res_alone "res randwrite 4k 16"
reps flood_alone "flood randwrite 4k 64"
echo "alone: res (qd 16) $(pick res_alone 1) IOPS [$(all res_alone 1)], flood (qd 64) $(pick flood_alone 1) IOPS [$(all flood_alone 1)]"

reps base "flood randwrite 4k 64" "res randwrite 4k 16"
echo "together, no settings: flood $(pick base 1) IOPS [$(all base 1)], res $(pick base 2) IOPS [$(all base 2)]"

R=$(( $(pick res_alone 1) / 2 ))
while ! st volume set res --iops-reserve "$R" >/dev/null 2>"$JOBS.err"; do
  echo "  (admission refused $R: $(cat "$JOBS.err"))"
  R=$((R / 2))
  [ "$R" -gt 0 ] || { echo "no reservation admitted" >&2; exit 1; }
done
rm -f "$JOBS.err"
reps reserved "flood randwrite 4k 64" "res randwrite 4k 16"
echo "together, res --iops-reserve $R: flood $(pick reserved 1) IOPS [$(all reserved 1)], res $(pick reserved 2) IOPS [$(all reserved 2)]: res/R = $(ratio "$(pick reserved 2)" "$R") (goal >= 0.90)"

L=$(( $(pick flood_alone 1) / 4 ))
st volume set res --iops-reserve none >/dev/null
st volume set flood --iops-limit "$L" >/dev/null
reps limited "flood randwrite 4k 64"
echo "limit: flood --iops-limit $L alone: $(pick limited 1) IOPS [$(all limited 1)]: got/limit = $(ratio "$(pick limited 1)" "$L") (goal 0.95-1.05)"
st volume set flood --iops-limit none --bw-limit 16M >/dev/null
reps bwlimited "flood randwrite 64k 16"
echo "limit: flood --bw-limit 16M alone, 64 KiB writes: $(pick bwlimited 1 bps) B/s: got/limit = $(ratio "$(pick bwlimited 1 bps)" $((16 << 20))) (goal 0.95-1.05)"
st volume set flood --bw-limit none >/dev/null

st volume set w1 --weight 300 >/dev/null
st volume set w2 --weight 100 >/dev/null
reps weights "w1 randwrite 4k 32" "w2 randwrite 4k 32"
echo "weights 300:100, both at qd 32: w1 $(pick weights 1) IOPS [$(all weights 1)], w2 $(pick weights 2) IOPS [$(all weights 2)]: w1/w2 = $(ratio "$(pick weights 1)" "$(pick weights 2)") (goal 2.7-3.3)"
st volume set w1 --weight none >/dev/null
st volume set w2 --weight none >/dev/null

# The reservation again while a capacity drive is rebuilt (the rebuild is a background class of
# the dispatcher, with the default weight; its own rate limit is off). Each rep fails and replaces
# a drive just before its run; runs last 5 s, less than the rebuild takes alone.
# (`status` exits 2 while the pool is degraded.)
rebuilding() { { st status --json || true; } | python3 -c 'import json, sys; print(any(v.get("rebuild") for v in json.load(sys.stdin)["volumes"]))'; }
st volume set res --iops-reserve "$R" >/dev/null
out=() still=()
for rep in $(seq "$REPS"); do
  drive=$((5 + rep % 3))
  st drive fail "$drive" --force >/dev/null
  st drive replace "$drive" >/dev/null
  out+=("$(RUNTIME=5 run "flood randwrite 4k 64" "res randwrite 4k 16")")
  still+=("$(rebuilding)")
  while [ "$(rebuilding)" = True ]; do sleep 0.5; done
done
RUNS[rebuilding]="${out[*]}"
echo "together during a rebuild (5 s runs; still rebuilding at the end of each: ${still[*]}), res --iops-reserve $R: flood $(pick rebuilding 1) IOPS [$(all rebuilding 1)], res $(pick rebuilding 2) IOPS [$(all rebuilding 2)]: res/R = $(ratio "$(pick rebuilding 2)" "$R") (goal >= 0.90)"
st volume show res | grep qos
