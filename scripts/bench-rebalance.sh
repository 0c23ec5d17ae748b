#!/bin/bash
# Pool growth under load (issue 14; docs/design/pool-growth.md, "Measured"): a pool of 6 capacity
# drives grows to 8 and rebalances, then a drive is removed, both while fio writes and verifies
# through NBD.
#
#   scripts/bench-rebalance.sh [--stria BIN] [--dir /dev/shm] [--volumes 12] [--volume-size 256M]
#                              [--rate 200M] [--idle-runs 3]
#
# VOLUMES ec:4+2 volumes v0, v1, ... of VOLUME-SIZE on 6 capacity sparse drive files in DIR (tmpfs
# by default): 6 member extents each, spread evenly. 12 volumes make 72 extents: 9 per drive on 8
# drives, 10 or 11 on 7, so "within 10 % of even" is reachable with whole extents after both the
# growth and the remove. The load is fio on v0 (which moves too): 4 KiB random writes at queue
# depth 16 over its first 256 MiB, each block once, then a read-back of all of them with
# verify=crc32c; one such run after another. Reported:
#   * p99 write latency of IDLE-RUNS runs with nothing moving (median), then of every run while
#     `pool rebalance --rate RATE` moves extents onto 2 added drives, and while `drive remove 0`
#     drains drive 0 (runs go on until the moves end);
#   * verify errors (any fio run that fails), moves made, the time they took;
#   * per-drive usage after the rebalance: each drive's used bytes against the mean (goal: within
#     10 %).
# Needs fio and nbdinfo (scripts/test.sh installs both). Everything it makes is removed at exit.
set -euo pipefail

STRIA=target/release/stria DIR=/dev/shm VOLUMES=12 VSIZE=256M RATE=200M IDLE_RUNS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --stria) STRIA=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --volumes) VOLUMES=$2; shift 2 ;;
    --volume-size) VSIZE=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --idle-runs) IDLE_RUNS=$2; shift 2 ;;
    *) echo "unknown argument: $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$STRIA" ] || { echo "no stria binary at $STRIA (cargo build --release -p stria)" >&2; exit 2; }

POOL=$(mktemp -d "$DIR/stria-rebalbench.XXXX")
SOCK="$POOL.sock"
SERVE_PID=
cleanup() {
  [ -n "$SERVE_PID" ] && kill -9 "$SERVE_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$POOL" "$SOCK" "$POOL".fio*
}
trap cleanup EXIT

st() { "$STRIA" --pool "$POOL" --log-level warn "$@" 2> >(grep -v 'sparse drive file' >&2); }
status() { st status --json || true; }  # exits 2 while a drive drains
uri() { echo "nbd+unix:///$1?socket=$SOCK"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# One fio run on v0; prints "p99_us errors" (errors: 1 when fio failed, e.g. a verify mismatch).
N=0
load_run() {
  N=$((N + 1))
  local out="$POOL.fio.$N"
  local rc=0
  fio --output-format=json --name=load --ioengine=nbd --uri="$(uri v0)" --rw=randwrite --bs=4k \
    --iodepth=16 --size=256M --randrepeat=0 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    >"$out" 2>"$out.err" || rc=1
  python3 - "$out" "$rc" <<'EOF'
import json, sys
t = open(sys.argv[1]).read()
try:
    j = json.loads(t[t.index("{"):])["jobs"][0]
    p99 = j["write"]["clat_ns"]["percentile"]["99.000000"] / 1000
    errs = j.get("error", 0)
except (ValueError, KeyError):
    p99, errs = 0, 1
print("%d %d" % (p99, 1 if errs or sys.argv[2] == "1" else 0))
EOF
}

moving() {  # True while extents move or a drive drains
  status | python3 -c '
import json, sys
r = json.load(sys.stdin).get("rebalance") or {}
print(bool(r.get("requested") or r.get("draining") or r.get("current")))'
}

# Runs the load until the moves end (at least once); prints the p99s and the error count.
during() {
  local p99s=() errors=0 started=$SECONDS
  while :; do
    read -r p e < <(load_run)
    p99s+=("$p")
    errors=$((errors + e))
    [ "$(moving)" = True ] || break
  done
  echo "${p99s[*]}|$errors|$((SECONDS - started))"
}

usage() {
  status | python3 -c '
import json, sys
d = [x for x in json.load(sys.stdin)["drives"] if x["class"] == "capacity" and x["state"] == "active"]
used = [x["used_bytes"] for x in d]
mean = sum(used) / len(used)
worst = max(abs(u - mean) / mean for u in used)
print("%d drives, used MiB %s, mean %.0f MiB, farthest from the mean %.1f %%" % (
    len(d), " ".join(str(u >> 20) for u in used), mean / 2**20, 100 * worst))'
}

echo "bench-rebalance on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
VOLS=$(seq -f 'v%g' 0 $((VOLUMES - 1)))
echo "pool: 6 capacity sparse drives in $DIR; $VOLUMES volumes of $VSIZE ec:4+2; load: fio on v0 (4 KiB random writes qd 16 over 256 MiB, then verify=crc32c)"
st pool create --capacity 6 --drive-size 4G >/dev/null
for v in $VOLS; do st volume create "$v" --size "$VSIZE" --layout ec:4+2 >/dev/null; done
"$STRIA" --pool "$POOL" --log-level warn serve --nbd "unix:$SOCK" >/dev/null 2>&1 &
SERVE_PID=$!
for _ in $(seq 600); do nbdinfo --size "$(uri v0)" >/dev/null 2>&1 && break; sleep 0.1; done
for v in $VOLS; do
  fio --name=fill --ioengine=nbd --uri="$(uri "$v")" --rw=write --bs=1M --iodepth=8 --size="$VSIZE" >/dev/null 2>&1
done
echo "before: $(usage)"

idle=() idle_err=0
for _ in $(seq "$IDLE_RUNS"); do
  read -r p e < <(load_run)
  idle+=("$p")
  idle_err=$((idle_err + e))
done
IDLE=$(printf '%s\n' "${idle[@]}" | median)
echo "idle: p99 write latency $IDLE us (median of [${idle[*]}]), $idle_err failed runs"

st drive add --class capacity --size 4G --no-rebalance >/dev/null
st drive add --class capacity --size 4G --no-rebalance >/dev/null
st pool rebalance --rate "$RATE" >/dev/null
IFS='|' read -r p99s errors took < <(during)
REB=$(printf '%s\n' $p99s | median)
moves=$(status | python3 -c 'import json, sys; print((json.load(sys.stdin).get("rebalance") or {}).get("moves_done", "?"))')
echo "grow 6 -> 8, pool rebalance --rate $RATE: took ${took} s; p99 $REB us (median of [$p99s]) = $(python3 -c "print('%.2f' % ($REB / $IDLE))") x idle; $errors failed runs"
echo "after the rebalance: $(usage)"

st drive remove 0 --rate "$RATE" >/dev/null
IFS='|' read -r p99s errors took < <(during)
REM=$(printf '%s\n' $p99s | median)
gone=$(status | python3 -c 'import json, sys; print(all(d["id"] != 0 for d in json.load(sys.stdin)["drives"]))')
echo "drive remove 0 under load: took ${took} s; drive gone: $gone; p99 $REM us (median of [$p99s]) = $(python3 -c "print('%.2f' % ($REM / $IDLE))") x idle; $errors failed runs"
echo "after the remove: $(usage)"
fio --name=final --ioengine=nbd --uri="$(uri v0)" --rw=randwrite --bs=4k --iodepth=16 --size=256M \
  --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 >/dev/null 2>&1 && echo "final write + verify pass on v0: ok" \
  || { echo "final write + verify pass on v0: FAILED"; exit 1; }
st scrub v1 --json | python3 -c 'import json, sys; r = json.load(sys.stdin); print("scrub v1:", {k: r[k] for k in ("blocks_checked", "blocks_repaired", "parity_blocks_fixed", "unrecoverable_blocks")})'
