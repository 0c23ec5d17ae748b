#!/usr/bin/env bash
# The real-process crash loop over every layout and scenario: `stria serve` on file drives, a
# verifying NBD client (crashloop.py), SIGKILL at random moments, many rounds on the same pool.
#
# Usage: tests/crash/run.sh PATH/TO/stria [--rounds N] [--jobs J] [--seed S] [--only PATTERN]
#   --rounds N   rounds per scenario (default 2: the short run of scripts/test.sh; the long run
#                quoted in the notes uses --rounds 200)
#   --jobs J     scenarios run at once (default 2)
#   --seed S     base seed (default: random; each scenario's seed is printed, so any failure can
#                be replayed with crashloop.py --seed)
#   --only RE    only scenarios whose whole name matches the extended regex RE (e.g. 'raid0|ec42')
# Exits non-zero if any scenario fails; prints one line per scenario and a summary table.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case ${1:-} in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
STRIA=$(realpath "${1:?usage: run.sh PATH/TO/stria [--rounds N] [--jobs J] [--seed S] [--only P]}")
[[ -x $STRIA && -f $STRIA ]] || { echo "run.sh: $1 is not an executable stria binary" >&2; exit 2; }
shift
ROUNDS=2 JOBS=2 SEED=$RANDOM ONLY=
while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || { echo "run.sh: needs python3-libnbd" >&2; exit 2; }

# name | crashloop.py arguments
SCENARIOS=(
  "raid0|--layout raid0"
  "raid0-tmpfs|--layout raid0 --tmpfs"
  "raid1|--layout raid1"
  "raid1-degraded|--layout raid1 --scenario degraded"
  "raid1-rebuilding|--layout raid1 --scenario rebuilding"
  "raid10|--layout raid10"
  "raid10-degraded|--layout raid10 --scenario degraded"
  "raid10-rebuilding|--layout raid10 --scenario rebuilding"
  "ec42|--layout ec:4+2"
  "ec42-degraded|--layout ec:4+2 --scenario degraded"
  "ec42-rebuilding|--layout ec:4+2 --scenario rebuilding"
  "ec42-moving|--layout ec:4+2 --scenario moving"
  "raid10-moving|--layout raid10 --scenario moving"
  "ec42-tmpfs|--layout ec:4+2 --tmpfs"
  "tiered|--layout tiered:ec:4+2"
  "tiered-destaging|--layout tiered:ec:4+2 --scenario destaging"
  "tiered-degraded|--layout tiered:ec:4+2 --scenario degraded"
  "tiered-rebuilding|--layout tiered:ec:4+2 --scenario rebuilding"
  "tiered-moving|--layout tiered:ec:4+2 --scenario moving"
  "log|--layout log:ec:4+2"
  "log-destaging|--layout log:ec:4+2 --scenario destaging"
  "log-degraded|--layout log:ec:4+2 --scenario degraded"
  "tiered-write-back|--layout tiered:ec:4+2 --cache-mode write-back"
  "log-write-back-destaging|--layout log:ec:4+2 --scenario destaging --cache-mode write-back"
  "tiered-write-back-clones|--layout tiered:ec:4+2 --scenario destaging --snapshots 3 --delete-snapshots --clones --resize --cache-mode write-back"
  "tiered-snapshots|--layout tiered:ec:4+2 --snapshots 3 --delete-snapshots"
  "log-snapshots|--layout log:ec:4+2 --scenario destaging --snapshots 3 --delete-snapshots"
  "tiered-clones|--layout tiered:ec:4+2 --scenario destaging --snapshots 3 --delete-snapshots --clones"
  "tiered-resize|--layout tiered:ec:4+2 --scenario destaging --snapshots 2 --delete-snapshots --resize --clones"
  "tiered-clone-snapshots|--layout tiered:ec:4+2 --scenario destaging --snapshots 2 --delete-snapshots --clones --clone-snapshots 3"
)

OUT=$(mktemp -d /tmp/stria-crashrun.XXXX)
trap 'rm -rf "$OUT"' EXIT
i=0
for s in "${SCENARIOS[@]}"; do
  name=${s%%|*}
  [[ -z $ONLY || $name =~ ^($ONLY)$ ]] || continue
  i=$((i + 1))
  printf '%s\t%s\t%s\n' "$name" "$((SEED * 100 + i))" "${s#*|}"
done >"$OUT/plan"

run_one() {
  local name=$1 seed=$2 args=$3 start=$SECONDS rc=0
  # shellcheck disable=SC2086
  $PY "$ROOT/tests/crash/crashloop.py" --stria "$STRIA" --rounds "$ROUNDS" --seed "$seed" $args \
    >"$OUT/$name.log" 2>&1 || rc=$?
  local last
  last=$(grep -E "round [0-9]+/|VIOLATION|ERROR:" "$OUT/$name.log" | tail -1)
  printf '%-18s seed %-8s %s  %4ss  %s\n' "$name" "$seed" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "$((SECONDS - start))" "${last#*] }"
  if [ $rc != 0 ]; then
    grep -v "stria is serving\|nbd+unix\|^$" "$OUT/$name.log" | tail -40 | sed "s/^/  $name: /"
  fi
  return $rc
}
export -f run_one
export ROOT STRIA ROUNDS OUT PY

[ -s "$OUT/plan" ] || { echo "run.sh: no scenario matches --only '$ONLY'" >&2; exit 2; }
echo "crash loop: $ROUNDS rounds per scenario, $JOBS at a time, base seed $SEED ($(wc -l <"$OUT/plan") scenarios)"
status=0
tr '\t' '\037' <"$OUT/plan" | xargs -r -P "$JOBS" -L 1 -d '\n' bash -c \
  'IFS=$'"'"'\037'"'"' read -r n s a <<<"$0"; run_one "$n" "$s" "$a"' || status=1
if [ $status = 0 ]; then echo "crash loop: every scenario passed"; else echo "crash loop: FAILED" >&2; fi
exit $status
