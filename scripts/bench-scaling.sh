#!/usr/bin/env bash
# Per-core scaling of the engine in process (issue 40's baseline): stria-bench-engine with 1, 2,
# 4, ... up to every core of the machine as tokio worker threads, 16 requests in flight per
# thread, IOPS per elapsed second, for ec:4+2 and raid10:3x2 against the same number of raw
# memory drives measured in the same run. Prints the CPU model first and one JSON line per cell.
#
# Usage: scripts/bench-scaling.sh [PATH/TO/stria-bench-engine] [OUTDIR]
# (built with `cargo build --release -p stria-bench`; OUTDIR gets scaling-T.jsonl per thread count)
set -euo pipefail
bench=${1:-target/release/stria-bench-engine}
out=${2:-.}
mkdir -p "$out"
cores=$(nproc)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $cores"
threads=1
while :; do
  echo "threads $threads" >&2
  "$bench" --layouts ec:4+2,raid10:3x2 --ops rand-read,rand-write,full-stripe-write \
    --threads "$threads" --qd $((16 * threads)) --clock wall --no-degraded --no-amp \
    --runs 3 --sample-ms 400 --data-mib 1024 --json | tee "$out/scaling-$threads.jsonl"
  [ "$threads" -ge "$cores" ] && break
  threads=$((threads * 2))
  [ "$threads" -gt "$cores" ] && threads=$cores
done
