#!/usr/bin/env bash
# RocksDB application benchmark (seed 003): db_bench on ext4 over stria volumes and over a local
# file of the same size on the same filesystem, in the same run.
#
# Usage: scripts/bench-rocksdb.sh [--quick] [--dir DIR] [--keys N] [--seconds S] [--size SIZE]
#                                 [--stria PATH] [--out FILE.json] [--report-dir DIR]
#
# What it does (docs/benchmarks.md, "RocksDB", lists results):
#  * builds `stria` in release (CARGO_TARGET_DIR, default target/), unless --stria names a binary;
#    builds `stria-report` the same way;
#  * makes a pool of sparse file drives in a fresh folder under --dir (default /dev/shm: 2 fast +
#    6 capacity drives of 3 GiB) with three volumes of --size (default 2 GiB): raid10, ec:4+2 and
#    tiered:ec:4+2, and serves them with `stria serve` on a Unix socket;
#  * the targets, one after the other: `local-file` (a sparse file of --size in the same folder,
#    so on the same filesystem as the drives); `nbdkit-file` (`nbdkit file` serving another such
#    file, through nbdfuse like the volumes: the same client path with a minimal server, so the
#    cost of nbdfuse and the NBD round trip shows apart from stria's); then each stria volume
#    exposed as a file by nbdfuse; then the raid10 volume again over iSCSI (`raid10-iscsi`: stria
#    serves it with --iscsi and qemu-nbd bridges qemu's iscsi:// driver to the NBD socket nbdfuse
#    reads, since this machine has no kernel iSCSI initiator: one more process and hop than the
#    NBD targets), and, to tell the bridge's cost from iSCSI's, the raid10 volume's NBD export
#    through the same kind of qemu-nbd bridge (`raid10-nbd-bridge`). Each gets a loop device (--direct-io=on), mkfs.ext4 (inode
#    tables and journal written up front, no discard) and a mount (noatime);
#  * db_bench (Debian rocksdb-tools; installed if missing), 16-byte keys, 400-byte values, no
#    compression, O_DIRECT for reads and for flush/compaction (so the page cache does not hide the
#    device), 1 thread, a fresh DB per target:
#      fillseq           --num keys in order, WAL off (bulk load);
#      overwrite         random keys for --seconds, WAL on, no sync;
#      readrandom        random point reads for --seconds;
#      readwhilewriting  random reads for --seconds beside one writer rate-limited to 2 MiB/s;
#  * prints ops/s per workload and target and the ratios to `local-file` and to `nbdkit-file`, writes every figure
#    (with db_bench's latency percentiles) to a JSON file, and runs `stria-report rocksdb` to
#    write REPORT.md and PNGs under target/bench-reports/rocksdb/.
# Everything it makes (mounts, loop devices, nbdfuse, the server, the files) is removed at the
# end, also on failure or Ctrl-C. Needs root (losetup, mount). Takes about 9 minutes on 2 CPUs
# (--quick: about 2: fewer keys, shorter runs).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
DIR=/dev/shm KEYS=1000000 SECONDS_EACH=30 SIZE=2G MODE=full STRIA=
OUT=$ROOT/target/bench-reports/rocksdb/bench-rocksdb.json REPORT_DIR=
WRITE_RATE=$((2 << 20))
while (($#)); do
  case $1 in
    --quick) KEYS=200000 SECONDS_EACH=8 MODE=quick; shift ;;
    --dir) DIR=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --stria) STRIA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --report-dir) REPORT_DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
REPORT_DIR=${REPORT_DIR:-$(dirname "$OUT")}
[ "$(id -u)" = 0 ] || { echo "needs root (losetup, mount)" >&2; exit 1; }

need=()
command -v db_bench >/dev/null || need+=(rocksdb-tools)
command -v nbdfuse >/dev/null || need+=(libnbd-bin)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v nbdkit >/dev/null || need+=(nbdkit)
command -v qemu-nbd >/dev/null || need+=(qemu-utils)
dpkg -s qemu-block-extra >/dev/null 2>&1 || need+=(qemu-block-extra)
command -v python3 >/dev/null || need+=(python3)
if ((${#need[@]})); then
  echo "installing ${need[*]} ..."
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ -z "$STRIA" ]; then
  echo "building stria (release) in $CARGO_TARGET_DIR ..."
  cargo build -q --release -p stria --manifest-path "$ROOT/Cargo.toml"
  STRIA=$CARGO_TARGET_DIR/release/stria
fi
echo "building stria-report in $CARGO_TARGET_DIR ..."
cargo build -q --release -p stria-report --manifest-path "$ROOT/Cargo.toml"
REPORT=$CARGO_TARGET_DIR/release/stria-report

mkdir -p "$DIR" "$(dirname "$OUT")" "$REPORT_DIR"
W=$(mktemp -d "$DIR/stria-bench-rocksdb.XXXXXX")
SERVER_PID= NBDKIT_PID= BRIDGE_PID= BRIDGE2_PID=
cleanup() {
  set +e
  for m in "$W"/mnt-*; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
  for f in "$W"/fuse-*/nbd "$W"/local.img; do
    [ -e "$f" ] || continue
    for l in $(losetup -j "$f" -O NAME -n 2>/dev/null); do losetup -d "$l"; done
  done
  for m in "$W"/fuse-*; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
  for p in $BRIDGE_PID $BRIDGE2_PID $SERVER_PID $NBDKIT_PID; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

POOL=$W/pool SOCK=$W/stria.sock
echo "pool and volumes in $W ..."
"$STRIA" pool create --pool "$POOL" --fast 2 --capacity 6 --drive-size 3G --log-level warn >/dev/null
"$STRIA" volume create raid10 --pool "$POOL" --size "$SIZE" --layout raid10 --log-level warn >/dev/null
"$STRIA" volume create ec --pool "$POOL" --size "$SIZE" --layout ec:4+2 --log-level warn >/dev/null
"$STRIA" volume create tiered --pool "$POOL" --size "$SIZE" --layout tiered:ec:4+2 --log-level warn >/dev/null
IPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$STRIA" serve --pool "$POOL" --nbd "unix:$SOCK" --iscsi "tcp:127.0.0.1:$IPORT" --log-level warn >"$W/serve.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
[ -S "$SOCK" ] || { cat "$W/serve.log" >&2; echo "stria serve did not start" >&2; exit 1; }
IQN=$(sed -n "s|^iSCSI: iscsi://127.0.0.1:$IPORT/\(.*\):VOLUME/0\$|\1|p" "$W/serve.log")
qemu-nbd -f raw --cache=none --socket="$W/iscsi-bridge.sock" --persistent \
  "iscsi://127.0.0.1:$IPORT/$IQN:raid10/0" >"$W/qemu-nbd.log" 2>&1 &
BRIDGE_PID=$!
for _ in $(seq 200); do [ -S "$W/iscsi-bridge.sock" ] && break; sleep 0.05; done
[ -S "$W/iscsi-bridge.sock" ] || { cat "$W/qemu-nbd.log" >&2; echo "qemu-nbd (iSCSI bridge) did not start" >&2; exit 1; }
qemu-nbd -f raw --cache=none --socket="$W/nbd-bridge.sock" --persistent \
  "nbd+unix:///raid10?socket=$SOCK" >"$W/qemu-nbd2.log" 2>&1 &
BRIDGE2_PID=$!
for _ in $(seq 200); do [ -S "$W/nbd-bridge.sock" ] && break; sleep 0.05; done
[ -S "$W/nbd-bridge.sock" ] || { cat "$W/qemu-nbd2.log" >&2; echo "qemu-nbd (NBD bridge) did not start" >&2; exit 1; }
truncate -s "$SIZE" "$W/nbdkit.img"
nbdkit -f -U "$W/nbdkit.sock" file "$W/nbdkit.img" >"$W/nbdkit.log" 2>&1 &
NBDKIT_PID=$!
for _ in $(seq 200); do [ -S "$W/nbdkit.sock" ] && break; sleep 0.05; done
[ -S "$W/nbdkit.sock" ] || { cat "$W/nbdkit.log" >&2; echo "nbdkit did not start" >&2; exit 1; }

# target name -> short name (folders) and NBD URI (none: the local file)
TARGETS=("local-file" "nbdkit-file" "raid10" "ec:4+2" "tiered:ec:4+2" "raid10-iscsi" "raid10-nbd-bridge")
declare -A SHORT=([local-file]=local [nbdkit-file]=nbdkit [raid10]=raid10 [ec:4+2]=ec [tiered:ec:4+2]=tiered
                  [raid10-iscsi]=raid10i [raid10-nbd-bridge]=raid10b)
declare -A URI=([local-file]="" [nbdkit-file]="nbd+unix:///?socket=$W/nbdkit.sock"
                [raid10]="nbd+unix:///raid10?socket=$SOCK" [ec:4+2]="nbd+unix:///ec?socket=$SOCK"
                [tiered:ec:4+2]="nbd+unix:///tiered?socket=$SOCK"
                [raid10-iscsi]="nbd+unix:///?socket=$W/iscsi-bridge.sock"
                [raid10-nbd-bridge]="nbd+unix:///?socket=$W/nbd-bridge.sock")
WORKLOADS=(fillseq overwrite readrandom readwhilewriting)
COMMON=(--key_size=16 --value_size=400 --compression_type=none --num="$KEYS" --threads=1 --histogram=1
        --use_direct_reads=1 --use_direct_io_for_flush_and_compaction=1 --seed=1 --statistics=0)
RESULTS=$W/results.tsv; : >"$RESULTS"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)

# attach TARGET: prints the block device holding the target's ext4.
attach() {
  local t=$1 e=${SHORT[$1]} file
  if [ -z "${URI[$t]}" ]; then
    file=$W/local.img; truncate -s "$SIZE" "$file"
  else
    mkdir -p "$W/fuse-$e"
    nbdfuse "$W/fuse-$e" "${URI[$t]}" >>"$W/nbdfuse.log" 2>&1 &
    for _ in $(seq 100); do [ -e "$W/fuse-$e/nbd" ] && break; sleep 0.1; done
    file=$W/fuse-$e/nbd
    [ -e "$file" ] || { echo "nbdfuse did not start for $t" >&2; return 1; }
  fi
  losetup -f --show --direct-io=on "$file" 2>>"$W/losetup.log"
}

# run_db TARGET WORKLOAD MOUNT: one db_bench run; appends a line to $RESULTS.
run_db() {
  local t=$1 w=$2 mnt=$3 args=()
  case $w in
    fillseq) args=(--disable_wal=1) ;;
    overwrite) args=(--use_existing_db=1 --disable_wal=0 --sync=0 --duration="$SECONDS_EACH") ;;
    readrandom) args=(--use_existing_db=1 --duration="$SECONDS_EACH") ;;
    readwhilewriting) args=(--use_existing_db=1 --duration="$SECONDS_EACH"
                            --benchmark_write_rate_limit="$WRITE_RATE") ;;
  esac
  db_bench --benchmarks="$w" --db="$mnt/db" "${COMMON[@]}" "${args[@]}" >"$W/db_bench.out" 2>&1 || {
    cat "$W/db_bench.out" >&2; echo "db_bench $w failed on $t" >&2; return 1; }
  cp "$W/db_bench.out" "$W/log-${t//:/_}-$w.txt"
  python3 - "$W/db_bench.out" "$t" "$w" >>"$RESULTS" <<'PY'
import json, re, sys
path, target, workload = sys.argv[1:]
text = open(path).read()
m = re.search(rf"^{re.escape(workload)}\s*:\s*([\d.]+) micros/op (\d+) ops/sec.*?(?:([\d.]+) MB/s)?$", text, re.M)
if not m:
    sys.exit(f"no result line for {workload} in db_bench's output:\n{text}")
rest = text[m.end():]
avg = re.search(r"Average:\s*([\d.]+)", rest)
pct = re.search(r"Percentiles:(.*)$", rest, re.M)
pcts = {k: float(v) for k, v in re.findall(r"P([\d.]+):\s*([\d.]+)", pct.group(1))} if pct else {}
print("\t".join([target, workload, m.group(2), m.group(3) or "", avg.group(1) if avg else "", json.dumps(pcts)]))
PY
  awk -F'\t' -v t="$t" -v w="$w" '$1 == t && $2 == w { printf "  %-18s %-14s %10d ops/s\n", w, t, $3 }' "$RESULTS"
}

for t in "${TARGETS[@]}"; do
  echo "$t:"
  dev=$(attach "$t")
  mnt=$W/mnt-${SHORT[$t]}; mkdir -p "$mnt"
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "$dev"
  mount -o noatime "$dev" "$mnt"
  for w in "${WORKLOADS[@]}"; do run_db "$t" "$w" "$mnt"; done
  umount "$mnt"
  losetup -d "$dev"
  if [ -n "${URI[$t]}" ]; then umount "$W/fuse-${SHORT[$t]}"; fi
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$RESULTS" "$OUT" "$MODE" "$KEYS" "$SECONDS_EACH" "$SIZE" "$WRITE_RATE" "$LOAD_START" "$LOAD_END" \
  "$(( $(date +%s) - START ))" "$(db_bench --version 2>&1 | head -1)" \
  "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs" \
  "$(findmnt -n -o FSTYPE --target "$DIR" | head -1)" "$DIR" "${TARGETS[*]}" <<'PY'
import json, sys
(results, out, mode, keys, secs_each, size, rate, load0, load1, secs, dbb, rev, cpu, fstype, where,
 targets) = sys.argv[1:]
targets = targets.split(" ")
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]
desc = {
    "fillseq": f"{int(keys):,} keys written in key order, WAL off (bulk load)",
    "overwrite": f"random keys overwritten for {secs_each} s, WAL on, no sync",
    "readrandom": f"random point reads for {secs_each} s",
    "readwhilewriting": f"random reads for {secs_each} s beside one writer rate-limited to "
                        f"{int(rate) >> 20} MiB/s (ops/s counts the reads)",
}
workloads = list(dict.fromkeys(r[1] for r in rows))
ops = {(r[0], r[1]): float(r[2]) for r in rows}
ref, path_ref = "local-file", "nbdkit-file"
res = []
for t, w, o, mbs, avg, pct in rows:
    base, path_base = ops.get((ref, w)), ops.get((path_ref, w))
    res.append({"target": t, "workload": w, "ops_per_s": float(o), "mb_s": float(mbs) if mbs else None,
                "mean_us": float(avg) if avg else None, "percentiles_us": json.loads(pct),
                "ratio_vs_reference": float(o) / base if base and t != ref else None,
                "ratio_vs_path_reference": float(o) / path_base if path_base and t not in (ref, path_ref) else None})
setup = (f"ext4 on a loop device (direct I/O) over each target, {size} each: stria volumes through nbdfuse "
         f"(pool of 2 fast + 6 capacity sparse file drives of 3 GiB on {fstype} at {where}, one `stria serve`), "
         f"a local sparse file on the same filesystem, and `nbdkit file` on another such file through nbdfuse "
         f"(the same client path as the volumes). db_bench: 16-byte keys, 400-byte values, no "
         f"compression, O_DIRECT reads and flush/compaction, 1 thread")
doc = {"cpu": cpu, "stria_rev": rev, "db_bench": dbb, "mode": mode, "setup": setup, "keys": int(keys),
       "seconds_per_workload": float(secs_each), "volume_size": size, "load_start": load0, "load_end": load1,
       "seconds": float(secs), "reference": ref, "path_reference": path_ref, "targets": targets,
       "workloads": [{"name": w, "description": desc.get(w, "")} for w in workloads], "results": res}
json.dump(doc, open(out, "w"), indent=1)
print(f"\nRocksDB db_bench on {cpu}; {mode} mode; load average {load0} -> {load1}; {secs} s")
print(f"ops/s (ratio to {ref}, ratio to {path_ref})")
print(f"{'workload':<18}" + "".join(f"{t:>24}" for t in targets))
for w in workloads:
    cells = []
    for t in targets:
        o = ops.get((t, w))
        base = ops.get((ref, w))
        pb = ops.get((path_ref, w))
        c = "-" if o is None else f"{o:.0f}" if t == ref or not base else f"{o:.0f} ({o / base:.2f}x"
        if o is not None and t not in (ref, path_ref) and pb:
            c += f", {o / pb:.2f}x"
        cells.append(c + ")" if "(" in c else c)
    print(f"{w:<18}" + "".join(f"{c:>24}" for c in cells))
print(f"\nJSON: {out}")
PY
"$REPORT" rocksdb "$OUT" --out "$REPORT_DIR"
