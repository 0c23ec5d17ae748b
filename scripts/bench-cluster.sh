#!/usr/bin/env bash
# A cluster volume against the same layout on one node, in the same run (docs/design/cluster.md
# §11.3): fio over NBD, 4 KiB random reads and writes at queue depth 1 and 16, for mirror:3 and
# ec:2+1. The cluster is one etcd and three `stria node` processes on 127.0.0.1 (every member a
# slice file of another node process, reached over TCP); the reference is `stria serve` with three
# file drives in one process. Drive files of both live on the same filesystem ($BENCH_DIR, default
# /var/tmp). "forwarded" is the cluster volume through a node that does not own it (one hop
# more). Runs alternate (cluster, forwarded, single, single, forwarded, cluster, ...); medians of
# --reps runs. Then ten planned moves of the mirror under a fio write load through a forwarding
# node: their median time, and fio's error (must be 0).
# Usage: scripts/bench-cluster.sh [--reps N] [--runtime S]   (needs etcd-server, fio, nbdcopy)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3; RUNTIME=5
while [ $# -gt 0 ]; do
  case $1 in
    --reps) REPS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--runtime S]" >&2; exit 2 ;;
  esac
done
for t in etcd fio nbdcopy; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 1; }; done
cargo build --release --locked -p stria >/dev/null
S=$PWD/target/release/stria
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/stria-bench-cluster.XXXX")
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null
  done
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
export STRIA_LOG=warn
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
EC=$(port); EP=$(port); ETCD=http://127.0.0.1:$EC
etcd --name b --data-dir "$W/etcd" --listen-client-urls $ETCD --advertise-client-urls $ETCD \
  --listen-peer-urls http://127.0.0.1:$EP --initial-advertise-peer-urls http://127.0.0.1:$EP \
  --initial-cluster b=http://127.0.0.1:$EP >"$W/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints $ETCD endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
NBD=()
for i in 0 1 2; do
  np=$(port); NBD+=("$np")
  "$S" node run --name "n$i" --etcd $ETCD --dir "$W/n$i" --listen "127.0.0.1:$(port)" --nbd "127.0.0.1:$np" \
    --slices 2 --slice-size 512M >"$W/n$i.log" 2>&1 &
  PIDS+=($!)
done
sleep 2
"$S" cluster volume-create m --layout mirror:3 --size 256M --etcd $ETCD >/dev/null
"$S" cluster volume-create e --layout ec:2+1 --size 256M --etcd $ETCD >/dev/null
owner_uri() { # volume -> nbd URI of its owner, once it serves
  for _ in $(seq 200); do
    local a; a=$("$S" cluster status --etcd $ETCD --json | python3 -c "import json,sys; v=[x for x in json.load(sys.stdin)['volumes'] if x['name']=='$1'][0]; print(v['nbd'] or '')")
    if [ -n "$a" ] && qemu-io -f raw -r -c 'read 0 4k' "nbd://$a/owner/$1" >/dev/null 2>&1; then echo "nbd://$a/$1"; return; fi
    sleep 0.1
  done
  echo "volume $1 is not served" >&2; exit 1
}
other_uri() { # volume owner-URI -> the URI of the same volume on another node (which forwards)
  for np in "${NBD[@]}"; do
    case $2 in *":$np/"*) ;; *) echo "nbd://127.0.0.1:$np/$1"; return ;; esac
  done
}
declare -A URI
URI[cluster-mirror]=$(owner_uri m); URI[cluster-ec]=$(owner_uri e)
URI[forwarded-mirror]=$(other_uri m "${URI[cluster-mirror]}"); URI[forwarded-ec]=$(other_uri e "${URI[cluster-ec]}")
SP=$(port)
"$S" pool create --pool "$W/single" --capacity 3 --drive-size 1G >/dev/null
"$S" volume create m --pool "$W/single" --layout raid1:3 --size 256M >/dev/null
"$S" volume create e --pool "$W/single" --layout ec:2+1 --size 256M >/dev/null
"$S" serve --pool "$W/single" --nbd "tcp:127.0.0.1:$SP" >"$W/single.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do qemu-io -f raw -r -c 'read 0 4k' "nbd://127.0.0.1:$SP/m" >/dev/null 2>&1 && break; sleep 0.1; done
URI[single-mirror]="nbd://127.0.0.1:$SP/m"; URI[single-ec]="nbd://127.0.0.1:$SP/e"
head -c 256M /dev/urandom >"$W/fill.img"
for t in cluster-mirror cluster-ec single-mirror single-ec; do nbdcopy "$W/fill.img" "${URI[$t]}"; done
rm -f "$W/fill.img"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cluster: 3 node processes + etcd on 127.0.0.1; single: stria serve, 3 file drives; $REPS runs of ${RUNTIME}s each, medians"
SAMPLES=$W/samples.tsv; : >"$SAMPLES"
n=0
for rep in $(seq "$REPS"); do
  for w in "randread 1" "randread 16" "randwrite 1" "randwrite 16"; do
    read -r rw qd <<<"$w"
    for layout in mirror ec; do
      order=(cluster forwarded single); [ $((n % 2)) = 1 ] && order=(single forwarded cluster); n=$((n + 1))
      for side in "${order[@]}"; do
        fio --name=b --ioengine=nbd --uri="${URI[$side-$layout]}" --rw="$rw" --bs=4k --iodepth="$qd" --size=256M \
          --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json --output="$W/fio.json" >/dev/null
        python3 - "$W/fio.json" "$side" "$layout" "$rw" "$qd" >>"$SAMPLES" <<'PY'
import json, sys
path, side, layout, rw, qd = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
d = job["write" if "write" in rw else "read"]
print("\t".join([side, layout, rw, qd, str(d["iops"]), str(d["clat_ns"]["percentile"]["99.000000"] / 1e3)]))
PY
      done
    done
  done
done
python3 - "$SAMPLES" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
med = {}
for side, layout, rw, qd, iops, p99 in rows:
    med.setdefault((layout, rw, qd, side), []).append((float(iops), float(p99)))
print(f"{'layout':8} {'workload':16} {'cluster IOPS':>13} {'single IOPS':>12} {'ratio':>6} {'cluster p99 us':>15} {'single p99 us':>14}"
      f" {'forwarded IOPS':>15} {'fwd/cluster':>11} {'fwd p99 us':>11}")
for layout in ("mirror", "ec"):
    for rw in ("randread", "randwrite"):
        for qd in ("1", "16"):
            c = med[(layout, rw, qd, "cluster")]; s = med[(layout, rw, qd, "single")]; f = med[(layout, rw, qd, "forwarded")]
            ci = statistics.median(x[0] for x in c); si = statistics.median(x[0] for x in s)
            cp = statistics.median(x[1] for x in c); sp = statistics.median(x[1] for x in s)
            fi = statistics.median(x[0] for x in f); fp = statistics.median(x[1] for x in f)
            name = f"{rw} 4k qd{qd}"
            print(f"{layout:8} {name:16} {ci:13.0f} {si:12.0f} {ci / si:6.2f} {cp:15.0f} {sp:14.0f}"
                  f" {fi:15.0f} {fi / ci:11.2f} {fp:11.0f}")
PY
# Planned moves (`stria cluster volume-move`) of the mirror, each to another node, while fio
# writes to it through a node that forwards: the move times, and fio must see no error.
fio --name=mv --ioengine=nbd --uri="${URI[forwarded-mirror]}" --rw=randwrite --bs=4k --iodepth=16 --size=256M \
  --time_based --runtime=20 --output-format=json --output="$W/fio-move.json" >/dev/null 2>"$W/fio-move.err" &
FIO=$!
sleep 2
MOVES=()
for i in $(seq 10); do
  to=n$((i % 3))
  out=$("$S" cluster volume-move m "$to" --etcd $ETCD)
  case $out in *" in "*" ms") MOVES+=("$(echo "$out" | sed 's/.* in \([0-9]*\) ms/\1/')") ;; *"already"*) ;; *) echo "move: $out" >&2 ;; esac
  sleep 0.5
done
fio_rc=0; wait $FIO || fio_rc=$?
errors=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(j['error'], j['write']['total_ios'])" "$W/fio-move.json" 2>/dev/null || echo "? ?")
python3 - "$errors" "$fio_rc" "${MOVES[@]}" <<'PY'
import statistics, sys
err, ios = sys.argv[1].split()
rc = sys.argv[2]
ms = [int(x) for x in sys.argv[3:]]
print(f"planned moves under load (randwrite qd16 through a forwarding node): {len(ms)} moves, "
      f"median {statistics.median(ms):.0f} ms, max {max(ms)} ms; fio exit {rc}, error {err}, {ios} writes")
PY
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
