#!/bin/bash
# Snapshot of a clone (freeze) and its delete (hand-up), against a snapshot of the volume, on a
# 1 GiB tiered:ec:4+2 volume whose clone rewrote all of it. No daemon; drive files on tmpfs.
set -e
S=${1:?usage: scripts/bench-clone-snapshots.sh path/to/stria}; W=$(mktemp -d /dev/shm/csnap.XXXX); trap 'rm -rf "$W"' EXIT
t() { local a=$(date +%s.%N); "$@" >/dev/null; awk -v a="$a" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }
$S pool create --pool $W/pool --fast 2 --capacity 6 --drive-size 3G >/dev/null
$S volume create v --pool $W/pool --size 1G --space 3G --layout tiered:ec:4+2 >/dev/null
head -c 1G /dev/urandom > $W/img
$S volume import v $W/img --pool $W/pool >/dev/null
$S snapshot create v s --pool $W/pool >/dev/null
$S volume clone v@s c --pool $W/pool >/dev/null
head -c 1G /dev/urandom > $W/img2
$S volume import c $W/img2 --pool $W/pool --overwrite >/dev/null
rm $W/img $W/img2
for i in 1 2 3; do
  a=$(t $S snapshot create v h$i --pool $W/pool)
  b=$(t $S snapshot create c t$i --pool $W/pool)
  c=$(t $S volume show c --pool $W/pool)
  d=$(t $S snapshot delete c t$i --pool $W/pool)
  e=$(t $S snapshot delete v h$i --pool $W/pool)
  echo "run $i: snapshot of v $a s, of the clone $b s, volume show (the command's own cost) $c s, delete of the clone's $d s, of v's $e s"
done
