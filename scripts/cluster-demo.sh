#!/usr/bin/env bash
# A three-node stria cluster on this machine (docs/design/cluster.md): one etcd member and three
# `stria node run` processes on 127.0.0.1, each with two 512 MiB file-backed slices under
# ./stria-cluster/, a mirror:3 volume `m` and an ec:2+1 volume `e` placed one slice per node.
# Prints the status (owners, epochs, members, NBD URIs) and client commands, then waits; stop
# with Ctrl-C (every process it started is stopped). Needs etcd (apt-get install etcd-server).
# Try: kill -9 the owner of `m` (its PID is printed) and watch `stria cluster status` name a new
# owner a few seconds later, with the data still there.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v etcd >/dev/null || { echo "needs etcd: apt-get install etcd-server" >&2; exit 1; }
cargo build --release --locked -p stria
STRIA=$PWD/target/release/stria
W=$PWD/stria-cluster
mkdir -p "$W"
ETCD=http://127.0.0.1:23791
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null
  done
}
trap cleanup EXIT INT TERM
etcd --name demo --data-dir "$W/etcd" --listen-client-urls $ETCD --advertise-client-urls $ETCD \
  --listen-peer-urls http://127.0.0.1:23801 --initial-advertise-peer-urls http://127.0.0.1:23801 \
  --initial-cluster demo=http://127.0.0.1:23801 >"$W/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do ETCDCTL_API=3 etcdctl --endpoints $ETCD endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
for i in 0 1 2; do
  "$STRIA" node run --name "n$i" --etcd $ETCD --dir "$W/n$i" --listen "127.0.0.1:770$i" \
    --nbd "127.0.0.1:1081$i" --http "tcp:127.0.0.1:982$i" --slices 2 --slice-size 512M >"$W/n$i.log" 2>&1 &
  PIDS+=($!)
  echo "node n$i: pid $!, slices on 127.0.0.1:770$i, NBD on 127.0.0.1:1081$i, page and metrics on http://127.0.0.1:982$i/, log $W/n$i.log"
done
sleep 2
"$STRIA" cluster volume-create m --layout mirror:3 --size 128M --etcd $ETCD 2>/dev/null || true
"$STRIA" cluster volume-create e --layout ec:2+1 --size 128M --etcd $ETCD 2>/dev/null || true
sleep 3
"$STRIA" cluster status --etcd $ETCD
cat <<EOT

Clients connect to any node (the owner, which the status names, saves a hop), for example:
  qemu-io -f raw -c 'write -P 0xab 0 1M' nbd://127.0.0.1:10810/m
  $STRIA cluster volume-move m n1 --etcd $ETCD    # a planned move: no error at the clients
  $STRIA cluster status --etcd $ETCD
Stop with Ctrl-C.
EOT
wait "${PIDS[0]}"
