#!/usr/bin/env bash
# iSCSI benchmark: stria's target against tgt (Linux's userspace iSCSI target, Debian `tgt`)
# serving a file on the same tmpfs, in the same run, with libiscsi's iscsi-perf (4 KiB random
# reads) and qemu-img bench through qemu's iscsi:// driver (4 KiB reads and writes, offsets
# stepping by 4 KiB), at queue depths 1 and 32.
#
# Usage: scripts/bench-iscsi.sh [PATH/TO/stria] [--reps N] [--seconds S] [--baseline PATH/TO/stria]
#                               [--serve-args "ARGS"]
#
#  * stria: a pool of 2 fast + 6 capacity file drives in /dev/shm, volumes r0 (raid0, 1 GiB) and
#    r1 (raid1, 1 GiB), `stria serve --iscsi`; tgt: `tgtd` with one target whose LUN is a 1 GiB
#    file in the same /dev/shm directory (its default backing store: read/write on the file);
#  * every LUN is filled with the same random data first (unwritten blocks would read as zeros
#    without touching anything);
#  * each workload runs on every LUN back to back, `--reps` times (default 3, 4 s each); the
#    script prints the CPU model, the median IOPS of each, and stria/tgt ratios;
#  * --serve-args "ARGS" adds flags to the benchmarked `stria serve` (not the baseline's), e.g.
#    "--iscsi-threads 0" (connections on the shared runtime, as before connection threads);
#  * --baseline: another stria build (an earlier commit) serves its own raid0 volume `base-r0`
#    from a pool of its own beside them, in the same rounds, and r0/base-r0 is printed too.
# Both servers run unpinned at the same priority; docs/benchmarks.md ("iSCSI") quotes results.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STRIA=$ROOT/target/release/stria REPS=3 SECS=4 BASE= SERVE_ARGS=
while (($#)); do
  case $1 in
    --reps) REPS=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --baseline) BASE=$(realpath "$2"); shift 2 ;;
    --serve-args) SERVE_ARGS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) STRIA=$(realpath "$1"); shift ;;
  esac
done
for tool in tgtd tgtadm iscsi-perf qemu-img; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install tgt libiscsi-bin qemu-utils qemu-block-extra)" >&2; exit 1; }
done
W=$(mktemp -d /dev/shm/stria-bench-iscsi.XXXX)
SPID= TPID= BPID=
cleanup() {
  set +e
  [ -z "$SPID" ] || kill "$SPID" 2>/dev/null
  [ -z "$BPID" ] || kill "$BPID" 2>/dev/null
  # tgtd does not stop on SIGTERM while it has targets.
  [ -z "$TPID" ] || kill -9 "$TPID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

export STRIA_LOG=warn
"$STRIA" pool create --pool "$W/pool" --fast 2 --capacity 6 --drive-size 2G >/dev/null
"$STRIA" volume create r0 --pool "$W/pool" --size 1G --layout raid0 >/dev/null
"$STRIA" volume create r1 --pool "$W/pool" --size 1G --layout raid1 >/dev/null
SP=$(free_port)
"$STRIA" serve --pool "$W/pool" --nbd "unix:$W/nbd.sock" --iscsi "tcp:127.0.0.1:$SP" $SERVE_ARGS >"$W/stria.log" 2>&1 &
SPID=$!
TP=$(free_port) CTL=$((1000 + RANDOM % 9000))  # tgtadm takes control ports up to 32767
truncate -s 1G "$W/tgt.img"
tgtd -f -C "$CTL" --iscsi "portal=127.0.0.1:$TP" >"$W/tgt.log" 2>&1 &
TPID=$!
for _ in $(seq 200); do
  (exec 3<>"/dev/tcp/127.0.0.1/$SP") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$TP") 2>/dev/null && break
  sleep 0.05
done
tgtadm -C "$CTL" --lld iscsi --op new --mode target --tid 1 -T iqn.2026-11.bench:tgt
tgtadm -C "$CTL" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$W/tgt.img"
tgtadm -C "$CTL" --lld iscsi --op bind --mode target --tid 1 -I ALL
IQN=$(sed -n "s|^iSCSI: iscsi://127.0.0.1:$SP/\\(.*\\):VOLUME/0\$|\\1|p" "$W/stria.log")
declare -A LUN=(
  [stria-r0]="iscsi://127.0.0.1:$SP/$IQN:r0/0"
  [stria-r1]="iscsi://127.0.0.1:$SP/$IQN:r1/0"
  [tgt]="iscsi://127.0.0.1:$TP/iqn.2026-11.bench:tgt/1"
)
NAMES=(stria-r0 stria-r1 tgt)
if [ -n "$BASE" ]; then
  "$BASE" pool create --pool "$W/base" --fast 2 --capacity 6 --drive-size 2G >/dev/null
  "$BASE" volume create r0 --pool "$W/base" --size 1G --layout raid0 >/dev/null
  BP=$(free_port)
  "$BASE" serve --pool "$W/base" --nbd "unix:$W/base-nbd.sock" --iscsi "tcp:127.0.0.1:$BP" >"$W/base.log" 2>&1 &
  BPID=$!
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$BP") 2>/dev/null && break; sleep 0.05; done
  BIQN=$(sed -n "s|^iSCSI: iscsi://127.0.0.1:$BP/\\(.*\\):VOLUME/0\$|\\1|p" "$W/base.log")
  LUN[base-r0]="iscsi://127.0.0.1:$BP/$BIQN:r0/0"
  NAMES+=(base-r0)
fi

head -c 1G /dev/urandom >"$W/fill.raw"
for n in "${NAMES[@]}"; do qemu-img convert -n -f raw -O raw "$W/fill.raw" "${LUN[$n]}"; done
rm -f "$W/fill.raw"

# One sample: IOPS of WORKLOAD (randread-perf, read-bench, write-bench) at DEPTH on LUN.
sample() {
  local workload=$1 depth=$2 lun=$3
  case $workload in
    randread-perf)
      timeout $((SECS + 30)) iscsi-perf -r -m "$depth" -b 8 -t "$SECS" "$lun" 2>&1 | tr '\r' '\n' \
        | sed -n 's/.*iops average \([0-9]*\) .*/\1/p' | tail -1 ;;
    read-bench|write-bench)
      local w=""; [ "$workload" = write-bench ] && w=-w
      local count=$((depth == 1 ? 20000 : 100000))
      local secs
      secs=$(qemu-img bench -f raw -t none $w -c "$count" -d "$depth" -s 4k -S 4k "$lun" 2>&1 \
        | sed -n 's/Run completed in \([0-9.]*\) seconds./\1/p')
      python3 -c "print(int($count / $secs))" ;;
  esac
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cpus"
echo "tgt: $(tgtd --version 2>&1 | head -1); stria: $("$STRIA" --version)"
RESULTS=$W/results.txt
for rep in $(seq "$REPS"); do
  for workload in randread-perf read-bench write-bench; do
    for depth in 1 32; do
      for n in "${NAMES[@]}"; do
        iops=$(sample "$workload" "$depth" "${LUN[$n]}")
        echo "$workload $depth $n ${iops:-0}" >>"$RESULTS"
      done
    done
  done
  echo "rep $rep done" >&2
done
python3 - "$RESULTS" <<'EOF'
import collections, statistics, sys
samples = collections.defaultdict(list)
for line in open(sys.argv[1]):
    workload, depth, name, iops = line.split()
    samples[(workload, int(depth), name)].append(int(iops))
base = any(k[2] == "base-r0" for k in samples)
head = f"{'workload':<14} {'qd':>3} {'stria-r0':>10} {'stria-r1':>10} {'tgt':>10} {'r0/tgt':>7} {'r1/tgt':>7}"
if base:
    head += f" {'base-r0':>10} {'r0/base':>7}"
print(f"{head}   (median IOPS of {len(next(iter(samples.values())))})")
for workload in ("randread-perf", "read-bench", "write-bench"):
    for depth in (1, 32):
        names = ("stria-r0", "stria-r1", "tgt") + (("base-r0",) if base else ())
        m = {n: statistics.median(samples[(workload, depth, n)]) for n in names}
        t = m["tgt"] or 1
        line = (f"{workload:<14} {depth:>3} {m['stria-r0']:>10.0f} {m['stria-r1']:>10.0f} {m['tgt']:>10.0f} "
                f"{m['stria-r0'] / t:>7.2f} {m['stria-r1'] / t:>7.2f}")
        if base:
            line += f" {m['base-r0']:>10.0f} {m['stria-r0'] / (m['base-r0'] or 1):>7.2f}"
        print(line)
EOF
