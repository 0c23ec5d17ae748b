#!/usr/bin/env bash
# The metrics of `stria serve --http` checked by the real thing: `promtool check metrics` on a
# scrape, then a real Prometheus (Debian's) scraping the daemon every second, queried through its
# HTTP API after known I/O through NBD: the counts it stored must be the counts the test made.
# Usage: tests/metrics/run.sh PATH/TO/stria   (installs prometheus and qemu-utils if missing)
# The last line is "metrics: N passed, M failed". Cleans up (servers, temp dir) even on failure.
set -euo pipefail
STRIA=$(realpath "${1:?usage: tests/metrics/run.sh PATH/TO/stria}")
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v qemu-io >/dev/null || need+=(qemu-utils)
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
PROMETHEUS=$(command -v prometheus || echo /usr/bin/prometheus)

W=$(mktemp -d /tmp/stria-metrics.XXXX)
POOL=$W/pool SOCK=$W/nbd.sock
SPID= PPID2=
cleanup() {
  set +e
  for p in $SPID $PPID2; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT INT TERM

passed=0 failed=0
check() {  # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok: $name"; else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$STRIA" pool create --pool "$POOL" --fast 2 --capacity 6 --drive-size 1G >/dev/null
"$STRIA" volume create v --pool "$POOL" --size 256M --layout ec:4+2 >/dev/null
"$STRIA" volume create t --pool "$POOL" --size 256M --layout tiered:ec:4+2 --cache-size 32M >/dev/null
HPORT=$(free_port)
STRIA_LOG=info "$STRIA" serve --pool "$POOL" --nbd "unix:$SOCK" --http "tcp:127.0.0.1:$HPORT" >"$W/serve.log" 2>&1 &
SPID=$!
for _ in $(seq 400); do curl -sf "http://127.0.0.1:$HPORT/api/v1/status" >/dev/null && break; sleep 0.05; done
TOKEN=$(cat "$POOL/http.token")

# Known I/O: 100 writes of 4 KiB and 50 reads of 8 KiB to v (qemu-io sends one NBD request each).
cmds=()
for i in $(seq 0 99); do cmds+=(-c "write -P 7 $((i * 4096)) 4k"); done
for i in $(seq 0 49); do cmds+=(-c "read $((i * 8192)) 8k"); done
qemu-io -f raw "nbd+unix:///v?socket=$SOCK" "${cmds[@]}" >/dev/null
# And 8 MiB to the tiered volume, so its cache and write amplification show.
qemu-io -f raw "nbd+unix:///t?socket=$SOCK" -c "write -P 9 0 8M" -c flush >/dev/null

curl -sf "http://127.0.0.1:$HPORT/metrics" >"$W/scrape.txt"
check "promtool check metrics passes on a scrape" promtool check metrics <"$W/scrape.txt"
check "the scrape counts the 100 writes to v" grep -qx 'stria_volume_ops_total{volume="v",op="write"} 100' "$W/scrape.txt"
check "the scrape holds no token" bash -c "! grep -qF '$TOKEN' '$W/scrape.txt'"

# A real Prometheus scraping every second.
PPORT=$(free_port)
cat >"$W/prometheus.yml" <<EOF
global: { scrape_interval: 1s, evaluation_interval: 1s }
scrape_configs:
  - job_name: stria
    static_configs: [ { targets: ["127.0.0.1:$HPORT"] } ]
EOF
"$PROMETHEUS" --config.file="$W/prometheus.yml" --storage.tsdb.path="$W/prom" \
  --web.listen-address="127.0.0.1:$PPORT" >"$W/prometheus.log" 2>&1 &
PPID2=$!
query() {  # query PROMQL: prints the first result's value (empty when none)
  curl -sf --get "http://127.0.0.1:$PPORT/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
wait_for() {  # wait_for PROMQL WANTED: true once the query gives WANTED (60 s at most)
  local got=""
  for _ in $(seq 120); do
    got=$(query "$1" 2>/dev/null || true)
    [ "$got" = "$2" ] && return 0
    sleep 0.5
  done
  echo "  $1 = '$got', wanted '$2'" >&2
  return 1
}
check "prometheus scrapes the daemon (up == 1)" wait_for 'up{job="stria"}' 1
check "prometheus stored 100 writes to v" wait_for 'stria_volume_ops_total{volume="v",op="write"}' 100
check "prometheus stored 50 reads of 400 KiB from v" wait_for 'stria_volume_bytes_total{volume="v",op="read"}' 409600
check "the write latency histogram counted 100" wait_for 'stria_volume_op_latency_seconds_count{volume="v",op="write"}' 100
check "every write is in a latency bucket at or below 17 s" \
  wait_for 'max(stria_volume_op_latency_seconds_bucket{volume="v",op="write",le="17.179869184"})' 100
check "drive writes were timed (capacity drive 2 has a write latency count)" \
  bash -c "[ -n \"\$(curl -sf --get 'http://127.0.0.1:$PPORT/api/v1/query' --data-urlencode 'query=stria_drive_op_latency_seconds_count{drive=\"2\",op=\"write\"} > 0' | grep -o '\"value\"')\" ]"
check "eight drives are active" wait_for 'sum(stria_drive_state{state="active"})' 8
check "the tiered volume counts the 8 MiB its clients wrote" \
  wait_for 'stria_tier_host_written_bytes_total{volume="t"}' 8388608
check "the tiered volume reports write amplification of its fast tier" \
  bash -c "[ -n \"\$(curl -sf --get 'http://127.0.0.1:$PPORT/api/v1/query' --data-urlencode 'query=stria_tier_write_amplification{volume=\"t\",tier=\"fast\"} > 0' | grep -o '\"value\"')\" ]"

check "the tiered volume's map log carried a change for each of the 2,048 blocks written" \
  bash -c "[ -n \"\$(curl -sf --get 'http://127.0.0.1:$PPORT/api/v1/query' --data-urlencode 'query=stria_tier_map_deltas_total{volume=\"t\"} >= 2048 and stria_tier_map_log_writes_total{volume=\"t\"} > 0' | grep -o '\"value\"')\" ]"

# A drive failed through the API shows in the next scrapes.
curl -sf -X POST -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$HPORT/api/v1/drives/3/fail" >/dev/null
check "a failed drive shows as failed" wait_for 'stria_drive_state{drive="3",state="failed"}' 1
check "its volume shows as degraded" wait_for 'stria_volume_state{volume="v",state="degraded"}' 1
check "the daemon's log holds no token" bash -c "! grep -qF '$TOKEN' '$W/serve.log'"

kill -TERM "$SPID"; wait "$SPID" && SPID= || { echo "stria serve did not stop cleanly"; failed=$((failed + 1)); }
echo "metrics: $passed passed, $failed failed"
[ "$failed" = 0 ]
