#!/usr/bin/env bash
# Real-process cluster scenarios (kill -9 and kill -STOP of a volume's owner under a register
# workload, checked for lost acknowledged writes and linearizability): see scenarios.py.
# Usage: tests/cluster/run.sh PATH/TO/stria [--rounds N] [--scenarios kill9,stop] [--ttl S]
set -euo pipefail
here=$(dirname "$0")
exec /usr/bin/python3 "$here/scenarios.py" "$@"
