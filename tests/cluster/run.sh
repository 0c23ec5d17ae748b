#!/usr/bin/env bash
# Real-process cluster scenarios (kill -9 and kill -STOP of a volume's owner, a node away past
# the out-time, etcd's majority paused, planned moves, a partition with --netns, under a
# register workload,
# checked for lost acknowledged writes and linearizability, then for redundancy back): see
# scenarios.py.
# Usage: tests/cluster/run.sh PATH/TO/stria [--rounds N] [--scenarios kill9,outtime,stop,etcd,move]
#        [--netns] [--ttl S]
set -euo pipefail
here=$(dirname "$0")
exec /usr/bin/python3 "$here/scenarios.py" "$@"
