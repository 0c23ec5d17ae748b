#!/usr/bin/env bash
# Real clients against `stria serve`: qemu-io/qemu-img, nbdinfo/nbdcopy/nbdfuse, fio's nbd engine
# with crc32c verification, ext4 on a loop device over nbdfuse with fsck, on raid0, raid1,
# ec:4+2, tiered:ec:4+2 and log:ec:4+2 volumes (the tiered and log ones with a small cache, so
# destage runs during the recipe; then a fast drive fails under fio and is replaced), ec:4+2 again with a drive failed
# mid-run, the python3-libnbd protocol tests, then a
# clean SIGTERM (exit 0), a kill -9 in the middle of writes (every flushed or FUA write is back
# after restart), and a kill -9 of a tiered volume with writes in flight and destage running
# (fio's verify_state_save/verify_state_load: every acknowledged write reads back).
# Usage: tests/clients/run.sh PATH/TO/stria
# Needs root (losetup, mount). Cleans up after itself, also on failure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STRIA=$(realpath "${1:?usage: run.sh PATH/TO/stria}")
W=$(mktemp -d /dev/shm/stria-clients.XXXX)
POOL=$W/pool
SOCK=$W/nbd.sock
PID=
export STRIA_LOG=${STRIA_LOG:-warn}

cleanup() {
  set +e
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -9 "$PID"; wait "$PID" 2>/dev/null; fi
  # Anything the recipe left mounted or attached under our directory: file systems first, then
  # the loop devices (found by their backing file, so before the fuse mounts under them go),
  # then the fuse mounts and any nbdfuse still serving one.
  for m in $(grep -o "$W/[a-z0-9]*mnt" /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null; done
  for f in fuse sfuse s1fuse cfuse gfuse gcfuse pfuse; do
    for l in $(losetup -j "$W/$f/nbd" -O NAME -n 2>/dev/null); do losetup -d "$l"; done
  done
  for m in $(grep -o "$W[^ ]*" /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null; done
  pkill -f "nbdfuse .*$W/" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT INT TERM

log() { printf '\n---- %s ----\n' "$*"; }

start() {
  "$STRIA" serve --pool "$POOL" --nbd "unix:$SOCK" --log-level info >"$W/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 400); do [ -S "$SOCK" ] && [ -S "$POOL/stria.sock" ] && return 0; sleep 0.025; done
  cat "$W/serve.log" >&2; echo "stria serve did not start" >&2; return 1
}

stop() {  # SIGTERM must finish cleanly with exit status 0
  kill -TERM "$PID"
  local rc=0; wait "$PID" || rc=$?
  PID=
  [ "$rc" = 0 ] || { cat "$W/serve.log" >&2; echo "stria serve exited with $rc after SIGTERM" >&2; return 1; }
  grep -q "pool closed cleanly" "$W/serve.log" || { cat "$W/serve.log" >&2; return 1; }
}

uri() { echo "nbd+unix:///$1?socket=$SOCK"; }

log "pool: 2 fast + 6 capacity sparse drives on tmpfs"
"$STRIA" pool create --pool "$POOL" --fast 2 --capacity 6 --drive-size 3G >/dev/null
"$STRIA" volume create r0 --pool "$POOL" --size 1G --layout raid0 >/dev/null
"$STRIA" volume create r1 --pool "$POOL" --size 1G --layout raid1 >/dev/null
"$STRIA" volume create ec --pool "$POOL" --size 1G --layout ec:4+2 >/dev/null
"$STRIA" volume create ecd --pool "$POOL" --size 1G --layout ec:4+2 >/dev/null
"$STRIA" volume create tv --pool "$POOL" --size 1G --layout tiered:ec:4+2 --cache-size 48M >/dev/null
"$STRIA" volume create lv --pool "$POOL" --size 1G --layout log:ec:4+2 --cache-size 48M >/dev/null
"$STRIA" volume create sv --pool "$POOL" --size 1G --layout tiered:ec:4+2 --cache-size 48M >/dev/null
start

status_json() {  # `stria status --json`; exit codes 2 and 3 (degraded, failed) are states, not errors
  "$STRIA" status --pool "$POOL" --json || { local c=$?; [ $c -ge 2 ] && [ $c -le 3 ]; }
}
counter() {  # counter VOLUME FIELD [PART]: a counter of a tiered or log volume from `stria status --json`
  status_json | /usr/bin/python3 -c '
import json, sys
t = [t for t in json.load(sys.stdin)["log"] if t["name"] == sys.argv[1]][0]
part = sys.argv[3] if len(sys.argv) > 3 else ""
print((([p for p in t["parts"] if p["role"] == part][0]) if part else t)[sys.argv[2]])' "$@"
}
tier() { counter tv "$@"; }

# The plain volumes' recipes run with QoS on (every request of the pool goes through the
# dispatcher): a reservation on r1 (the first one calibrates the pool), limits on ec.
"$STRIA" volume set r1 --pool "$POOL" --iops-reserve 1000 >/dev/null
"$STRIA" volume set ec --pool "$POOL" --iops-limit 20000 --bw-limit 400M >/dev/null
for v in r0 r1 ec; do
  log "client recipe on $v (QoS on)"
  "$ROOT/tests/nbd/clients.sh" "$SOCK" "$v" >"$W/recipe-$v.log" 2>&1 || { tail -50 "$W/recipe-$v.log" >&2; exit 1; }
  grep -q NBD_CLIENTS_OK "$W/recipe-$v.log"
  "$STRIA" scrub "$v" --pool "$POOL"
done
scheduled=$("$STRIA" volume show ec --pool "$POOL" --json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["qos"]["ops"])')
echo "ec: $scheduled requests went through the QoS dispatcher"
[ "$scheduled" -gt 1000 ] || { echo "the dispatcher saw too few of ec's requests" >&2; exit 1; }
"$STRIA" volume set r1 --pool "$POOL" --iops-reserve none >/dev/null
"$STRIA" volume set ec --pool "$POOL" --iops-limit none --bw-limit none >/dev/null

# The recipe on a thin, log-structured volume (48 MiB write cache: destage and GC run during it).
log_recipe() {  # log_recipe NAME
  local v=$1
  "$ROOT/tests/nbd/clients.sh" "$SOCK" "$v" >"$W/recipe-$v.log" 2>&1 || { tail -50 "$W/recipe-$v.log" >&2; exit 1; }
  grep -q NBD_CLIENTS_OK "$W/recipe-$v.log"
  local destaged partial written allocated
  destaged=$(counter "$v" destaged_blocks); partial=$(counter "$v" partial_stripe_writes seg)
  written=$(counter "$v" host_write_bytes); allocated=$(counter "$v" allocated_bytes)
  echo "$v: $destaged blocks destaged, $partial partial-stripe segment writes, $allocated bytes allocated after $written written"
  [ "$destaged" -gt 0 ] || { echo "$v: nothing was destaged during the recipe" >&2; exit 1; }
  [ "$partial" = 0 ] || { echo "$v: the segment space saw $partial partial-stripe writes" >&2; exit 1; }
  # Thin: the recipe ends with fstrim on ext4 and discards, so much less is allocated than written.
  [ "$allocated" -lt $((written / 2)) ] || { echo "$v: TRIM gave no space back" >&2; exit 1; }
  "$STRIA" scrub "$v" --pool "$POOL"
}
log "client recipe on tiered:ec:4+2 (cache and map on the fast drives)"
log_recipe tv
log "client recipe on log:ec:4+2 (cache and map on the capacity drives)"
log_recipe lv

log "tiered: a snapshot holds the volume as it was, read-only as tv@s1, through destage and a restart"
qemu-io -f raw "$(uri tv)" -c 'write -P 0x11 0 64M' >/dev/null
"$STRIA" snapshot create tv s1 --pool "$POOL"
qemu-io -f raw "$(uri tv)" -c 'write -P 0x22 0 32M' >/dev/null
"$STRIA" snapshot list tv --pool "$POOL" --json | grep -q '"export": "tv@s1"'
nbdinfo "$(uri tv@s1)" | grep -q "is_read_only: true" || { nbdinfo "$(uri tv@s1)" >&2; echo "tv@s1 is not read-only" >&2; exit 1; }
! qemu-io -f raw "$(uri tv@s1)" -c 'write -P 0x33 0 4k' >/dev/null 2>&1 || { echo "a write to tv@s1 was taken" >&2; exit 1; }
check_snapshot() {  # the snapshot reads A everywhere; the volume B then A
  local out
  out=$(qemu-io -f raw -r "$(uri tv@s1)" -c 'read -P 0x11 0 64M' 2>&1)
  ! grep -q -i "verification failed\|error" <<<"$out" || { echo "tv@s1 ($1): $out" >&2; exit 1; }
  out=$(qemu-io -f raw "$(uri tv)" -c 'read -P 0x22 0 32M' -c 'read -P 0x11 32M 32M' 2>&1)
  ! grep -q -i "verification failed\|error" <<<"$out" || { echo "tv ($1): $out" >&2; exit 1; }
}
check_snapshot "after the overwrite"
# 96 MiB of random writes elsewhere: the 48 MiB cache destages (the snapshot's cached blocks
# among them) and GC runs if the space needs it (the log simulation covers GC of snapshot blocks).
fio --name=snapgc --ioengine=nbd --uri="$(uri tv)" --rw=randwrite --bs=4k --iodepth=16 --size=96M \
  --offset=128M --norandommap --randrepeat=0 >"$W/fio-snapgc.log" 2>&1 || { cat "$W/fio-snapgc.log" >&2; exit 1; }
echo "tv: $(counter tv destaged_blocks) blocks destaged, $(counter tv gc_moved_blocks) moved by GC"
check_snapshot "after destage"
stop; start
check_snapshot "after a restart"
"$STRIA" scrub tv --pool "$POOL"

log "tiered: deleting snapshots (an older one, then the newest) keeps every other view"
"$STRIA" snapshot create tv s2 --pool "$POOL"
qemu-io -f raw "$(uri tv)" -c 'write -P 0x44 0 16M' >/dev/null
check_rest() {  # s2 (if there) reads B then A; the volume C, B, A
  local out
  if [ "${2:-}" = with-s2 ]; then
    out=$(qemu-io -f raw -r "$(uri tv@s2)" -c 'read -P 0x22 0 32M' -c 'read -P 0x11 32M 32M' 2>&1)
    ! grep -q -i "verification failed\|error" <<<"$out" || { echo "tv@s2 ($1): $out" >&2; exit 1; }
  fi
  out=$(qemu-io -f raw "$(uri tv)" -c 'read -P 0x44 0 16M' -c 'read -P 0x22 16M 16M' -c 'read -P 0x11 32M 32M' 2>&1)
  ! grep -q -i "verification failed\|error" <<<"$out" || { echo "tv ($1): $out" >&2; exit 1; }
}
# What `snapshot list` says only s1 holds is what its delete frees; s1 references its 64 MiB of
# 0x11 at least, and shares 32M..64M with s2 and the volume.
"$STRIA" snapshot list tv --pool "$POOL" --json >"$W/snaps.json"
excl=$(python3 -c 'import json, sys; print([s for s in json.load(sys.stdin) if s["name"] == "s1"][0]["exclusive_bytes"])' <"$W/snaps.json")
python3 - "$W/snaps.json" <<'PY' || { cat "$W/snaps.json" >&2; exit 1; }
import json, sys
s1 = [s for s in json.load(open(sys.argv[1])) if s["name"] == "s1"][0]
assert s1["referenced_bytes"] >= 64 << 20, s1
assert s1["shared_bytes"] >= 32 << 20, s1
assert s1["referenced_bytes"] == s1["shared_bytes"] + s1["exclusive_bytes"], s1
print(f"tv@s1: {s1['referenced_bytes']} bytes of data, {s1['shared_bytes']} shared")
PY
freed=$("$STRIA" snapshot delete tv s1 --wait --pool "$POOL" --json |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["blocks_freed"] * 4096)')
echo "tv@s1: $excl bytes only in it, $freed freed by its delete"
[ "$excl" = "$freed" ] && [ "$excl" -gt 0 ] || { echo "tv@s1: exclusive $excl, freed $freed" >&2; exit 1; }
! nbdinfo "$(uri tv@s1)" >/dev/null 2>&1 || { echo "tv@s1 is still exported after its delete" >&2; exit 1; }
check_rest "s1 deleted" with-s2
# Without --wait the delete is left to the volume's background task: the snapshot is gone at
# once, and `volume show` counts the delete until the task has handed its pages on.
"$STRIA" snapshot delete tv s2 --pool "$POOL" --json | grep -q '"in_background": true'
[ "$("$STRIA" snapshot list tv --pool "$POOL" --json | tr -d ' \n')" = "[]" ] || { echo "snapshots left after deleting both" >&2; exit 1; }
for _ in $(seq 300); do
  "$STRIA" volume show tv --pool "$POOL" --json | grep -q '"deletes_in_progress"' || break
  sleep 0.1
done
! "$STRIA" volume show tv --pool "$POOL" --json | grep -q '"deletes_in_progress"' || { echo "tv@s2's delete did not finish in the background" >&2; exit 1; }
! "$STRIA" snapshot delete tv s2 --pool "$POOL" 2>/dev/null || { echo "deleting a deleted snapshot succeeded" >&2; exit 1; }
check_rest "both deleted"
stop; start
check_rest "both deleted, after a restart"
"$STRIA" scrub tv --pool "$POOL"

log "ext4 on tiered:ec:4+2: a snapshot made under a fio verify load holds exactly the files before it; a rollback to it"
# ext4 on sv through nbdfuse and a loop device; files A, then fio (crc32c verify) on a file of
# the filesystem; amid it the filesystem is frozen (as a guest agent does), the snapshot made and
# the volume copied; then files B. The snapshot, served read-only, must pass fsck -n, hold A with
# the same contents and none of B, and equal the copy (qemu-img compare).
mkdir -p "$W/sfuse" "$W/smnt" "$W/s1fuse" "$W/s1mnt"
nbdfuse "$W/sfuse" "$(uri sv)" &
SFUSE=$!
for _ in $(seq 50); do [ -e "$W/sfuse/nbd" ] && break; sleep 0.1; done
SL=$(losetup -f --show --direct-io=on "$W/sfuse/nbd")
mkfs.ext4 -q -F "$SL"
mount "$SL" "$W/smnt"
mkdir "$W/smnt/a"
cp -r /usr/share/doc/apt /usr/share/doc/bash "$W/smnt/a/" 2>/dev/null || cp -r /usr/share/doc "$W/smnt/a/"
dd if=/dev/urandom of="$W/smnt/a/big" bs=1M count=40 status=none
(cd "$W/smnt" && find a -type f -print0 | sort -z | xargs -0 sha256sum) >"$W/sums-a"
sync -f "$W/smnt"
fio --name=load --directory="$W/smnt" --verify_state_save=0 --size=256M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 \
  --verify=crc32c --verify_fatal=1 --verify_backlog=512 >"$W/fio-snapload.log" 2>&1 &
FIO=$!
sleep 2
kill -0 "$FIO" 2>/dev/null || { cat "$W/fio-snapload.log" >&2; echo "fio ended before the snapshot" >&2; exit 1; }
fsfreeze -f "$W/smnt"
t0=$(date +%s.%N)
"$STRIA" snapshot create sv s1 --pool "$POOL" >/dev/null
echo "sv: snapshot s1 made in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }') s (filesystem frozen, fio waiting)"
nbdcopy "$(uri sv)" "$W/sv-at-s1.img"
fsfreeze -u "$W/smnt"
wait "$FIO" || { cat "$W/fio-snapload.log" >&2; echo "fio verify failed on sv" >&2; exit 1; }
grep -q "err= 0" "$W/fio-snapload.log" || { cat "$W/fio-snapload.log" >&2; exit 1; }
echo "sv: fio under the snapshot: $(grep -m1 -E '^ +write:' "$W/fio-snapload.log" | sed 's/^ *//')"
mkdir "$W/smnt/b"; dd if=/dev/urandom of="$W/smnt/b/after" bs=1M count=8 status=none
rm -r "$W/smnt/a/big"
sync -f "$W/smnt"
# The snapshot, read-only: nbdfuse, a read-only loop device, fsck -n, then a read-only mount.
nbdfuse -r "$W/s1fuse" "$(uri sv@s1)" &
S1FUSE=$!
for _ in $(seq 50); do [ -e "$W/s1fuse/nbd" ] && break; sleep 0.1; done
S1L=$(losetup -f --show -r "$W/s1fuse/nbd")
fsck.ext4 -fn "$S1L"
mount -o ro,noload "$S1L" "$W/s1mnt"
(cd "$W/s1mnt" && sha256sum --quiet -c "$W/sums-a") || { echo "sv@s1 does not hold files A as written" >&2; exit 1; }
[ ! -e "$W/s1mnt/b" ] || { echo "sv@s1 holds files written after it" >&2; exit 1; }
umount "$W/s1mnt"; losetup -d "$S1L"; umount "$W/s1fuse"; wait "$S1FUSE"
qemu-img compare -f raw -F raw "$W/sv-at-s1.img" "$(uri sv@s1)"
# The volume goes on: B there, A's big file gone, fsck clean.
[ -e "$W/smnt/b/after" ] && [ ! -e "$W/smnt/a/big" ] || { echo "sv lost writes after the snapshot" >&2; exit 1; }
! "$STRIA" volume rollback sv s1 --pool "$POOL" 2>"$W/rollback.err" || { echo "a rollback under a mounted file system was taken" >&2; exit 1; }
grep -q "client(s) attached" "$W/rollback.err" || { cat "$W/rollback.err" >&2; exit 1; }
umount "$W/smnt"; fsck.ext4 -fn "$SL"; losetup -d "$SL"; umount "$W/sfuse"; wait "$SFUSE"
# Rolled back (no client attached now), the volume is the copy again, and s1 is still there.
"$STRIA" volume rollback sv s1 --pool "$POOL"
qemu-img compare -f raw -F raw "$W/sv-at-s1.img" "$(uri sv)"
qemu-img compare -f raw -F raw "$W/sv-at-s1.img" "$(uri sv@s1)"

log "a clone of sv@s1, mounted read-write and changed; sv and sv@s1 stay as they were"
t0=$(date +%s.%N)
"$STRIA" volume clone sv@s1 svc --pool "$POOL" >/dev/null
echo "svc: clone of sv@s1 made in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }') s"
"$STRIA" volume list --pool "$POOL" | grep -q "^svc .*clone of sv@s1" || { "$STRIA" volume list --pool "$POOL" >&2; exit 1; }
mkdir -p "$W/cfuse" "$W/cmnt"
nbdfuse "$W/cfuse" "$(uri svc)" &
CFUSE=$!
for _ in $(seq 50); do [ -e "$W/cfuse/nbd" ] && break; sleep 0.1; done
CL=$(losetup -f --show --direct-io=on "$W/cfuse/nbd")
fsck.ext4 -fn "$CL"
mount "$CL" "$W/cmnt"
(cd "$W/cmnt" && sha256sum --quiet -c "$W/sums-a") || { echo "svc does not hold files A as written" >&2; exit 1; }
[ ! -e "$W/cmnt/b" ] || { echo "svc holds files written to sv after s1" >&2; exit 1; }
mkdir "$W/cmnt/c"; dd if=/dev/urandom of="$W/cmnt/c/new" bs=1M count=16 status=none
rm "$W/cmnt/a/big"
(cd "$W/cmnt" && sha256sum c/new) >"$W/sums-c"
umount "$W/cmnt"; fsck.ext4 -fn "$CL"
mount -o ro "$CL" "$W/cmnt"
(cd "$W/cmnt" && sha256sum --quiet -c "$W/sums-c") && [ ! -e "$W/cmnt/a/big" ] || { echo "svc lost its own writes" >&2; exit 1; }
umount "$W/cmnt"; losetup -d "$CL"; umount "$W/cfuse"; wait "$CFUSE"
# The clone's writes went to the clone only.
qemu-img compare -f raw -F raw "$W/sv-at-s1.img" "$(uri sv)"
qemu-img compare -f raw -F raw "$W/sv-at-s1.img" "$(uri sv@s1)"
nbdcopy "$(uri svc)" "$W/svc-now.img"
! qemu-img compare -q -f raw -F raw "$W/sv-at-s1.img" "$W/svc-now.img" || { echo "the clone's writes are not in it" >&2; exit 1; }

log "a snapshot of the clone svc made under a fio verify load, a clone of that, a rollback of svc to it"
# ext4 on svc again; fio (crc32c verify) on a file of it; amid it the file system is frozen, the
# snapshot svc@t1 made and svc copied; then files D. svc@t1 must equal the copy, check clean and
# hold the files of before; a clone of it reads as it; svc, rolled back, is the copy again.
nbdfuse "$W/cfuse" "$(uri svc)" &
CFUSE=$!
for _ in $(seq 50); do [ -e "$W/cfuse/nbd" ] && break; sleep 0.1; done
CL=$(losetup -f --show --direct-io=on "$W/cfuse/nbd")
mount "$CL" "$W/cmnt"
fio --name=load --directory="$W/cmnt" --verify_state_save=0 --size=128M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 \
  --verify=crc32c --verify_fatal=1 --verify_backlog=512 >"$W/fio-clonesnap.log" 2>&1 &
FIO=$!
sleep 2
kill -0 "$FIO" 2>/dev/null || { cat "$W/fio-clonesnap.log" >&2; echo "fio ended before the snapshot" >&2; exit 1; }
fsfreeze -f "$W/cmnt"
t0=$(date +%s.%N)
"$STRIA" snapshot create svc t1 --pool "$POOL" >/dev/null
echo "svc: snapshot t1 made in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }') s (filesystem frozen, fio waiting)"
nbdcopy "$(uri svc)" "$W/svc-at-t1.img"
fsfreeze -u "$W/cmnt"
wait "$FIO" || { cat "$W/fio-clonesnap.log" >&2; echo "fio verify failed on svc" >&2; exit 1; }
grep -q "err= 0" "$W/fio-clonesnap.log" || { cat "$W/fio-clonesnap.log" >&2; exit 1; }
(cd "$W/cmnt" && sha256sum --quiet -c "$W/sums-c") || { echo "svc lost its files" >&2; exit 1; }
mkdir "$W/cmnt/d"; dd if=/dev/urandom of="$W/cmnt/d/after" bs=1M count=8 status=none
sync -f "$W/cmnt"
! "$STRIA" volume rollback svc t1 --pool "$POOL" 2>"$W/rollback.err" || { echo "a rollback of a mounted clone was taken" >&2; exit 1; }
grep -q "client(s) attached" "$W/rollback.err" || { cat "$W/rollback.err" >&2; exit 1; }
umount "$W/cmnt"; fsck.ext4 -fn "$CL"; losetup -d "$CL"; umount "$W/cfuse"; wait "$CFUSE"
qemu-img compare -f raw -F raw "$W/svc-at-t1.img" "$(uri svc@t1)"
fsck.ext4 -fn "$W/svc-at-t1.img" >/dev/null
"$STRIA" snapshot list svc --pool "$POOL" | grep -q "svc@t1" || { "$STRIA" snapshot list svc --pool "$POOL" >&2; exit 1; }
"$STRIA" volume clone svc@t1 svcc --pool "$POOL" | grep -q "of svc@t1" || { echo "the clone of svc@t1 says otherwise" >&2; exit 1; }
qemu-img compare -f raw -F raw "$W/svc-at-t1.img" "$(uri svcc)"
# The clone's pages are dropped by the daemon's background task; the rollback finishes it first.
"$STRIA" volume delete svcc --pool "$POOL" | grep -q "dropped in the background" || { echo "a clone's delete was not left to the background" >&2; exit 1; }
"$STRIA" volume rollback svc t1 --pool "$POOL" >/dev/null
qemu-img compare -f raw -F raw "$W/svc-at-t1.img" "$(uri svc)"
# The snapshot's delete hands its pages up into svc, which reads the same.
"$STRIA" snapshot delete svc t1 --pool "$POOL" >/dev/null
qemu-img compare -f raw -F raw "$W/svc-at-t1.img" "$(uri svc)"
stop; start
qemu-img compare -f raw -F raw "$W/svc-at-t1.img" "$(uri svc)"
echo "svc@t1: made under fio, equal to the copy, fsck clean; a clone of it and a rollback to it equal it too"
mv "$W/svc-at-t1.img" "$W/svc-now.img"

# Deleting the snapshot keeps it (hidden) for the clone; so does deleting the origin: sv is no
# longer exported, listed as a volume or free as a name, and the clone reads as before, also
# after a restart; the clone's delete then takes sv's parts.
"$STRIA" snapshot delete sv s1 --pool "$POOL" --json | grep -q '"kept_for_clones": true'
[ "$("$STRIA" snapshot list sv --pool "$POOL" --json | tr -d ' \n')" = "[]" ] || { echo "a deleted snapshot is listed" >&2; exit 1; }
"$STRIA" scrub sv --pool "$POOL"
"$STRIA" volume delete sv --pool "$POOL" | tee "$W/delete.out"
grep -q "kept for its clones (svc)" "$W/delete.out" || { echo "the delete does not say what keeps sv" >&2; exit 1; }
check_sv_kept() {
  "$STRIA" volume list --pool "$POOL" | grep -q "^sv .*deleted (kept for svc)" || { "$STRIA" volume list --pool "$POOL" >&2; exit 1; }
  ! qemu-img info -f raw "$(uri sv)" >/dev/null 2>&1 || { echo "a deleted origin is still exported" >&2; exit 1; }
  ! "$STRIA" volume create sv --pool "$POOL" --size 16M --layout raid1 2>"$W/create.err" || { echo "a kept origin's name was reused" >&2; exit 1; }
  grep -q "kept, hidden, for its clones (svc)" "$W/create.err" || { cat "$W/create.err" >&2; exit 1; }
  qemu-img compare -f raw -F raw "$W/svc-now.img" "$(uri svc)"
}
check_sv_kept
stop; start
check_sv_kept
"$STRIA" volume delete svc --pool "$POOL"
! "$STRIA" volume show svc --pool "$POOL" 2>/dev/null || { echo "a deleted clone is still there" >&2; exit 1; }
! "$STRIA" volume list --pool "$POOL" | grep -q "^sv " || { echo "sv outlived its last clone" >&2; exit 1; }
! "$STRIA" volume show sv.seg --pool "$POOL" >/dev/null 2>&1 || { echo "sv's parts outlived its last clone" >&2; exit 1; }
rm -f "$W/sv-at-s1.img" "$W/svc-now.img"

log "ext4 on a raid1 volume converted to tiered:ec:4+2 (volume convert): the same bytes, fsck clean, then snapshots"
# Refused while the file system is mounted over NBD; converted once it is not, the volume equals
# a copy taken before (qemu-img compare), its ext4 checks clean and holds its files, takes new
# ones and a snapshot that a restart keeps (docs/design/convert.md).
"$STRIA" volume create pv --pool "$POOL" --size 256M --layout raid1 >/dev/null
mkdir -p "$W/pfuse" "$W/pmnt"
nbdfuse "$W/pfuse" "$(uri pv)" &
PFUSE=$!
for _ in $(seq 50); do [ -e "$W/pfuse/nbd" ] && break; sleep 0.1; done
PL=$(losetup -f --show --direct-io=on "$W/pfuse/nbd")
mkfs.ext4 -q -F "$PL"
mount "$PL" "$W/pmnt"
mkdir "$W/pmnt/a"
cp -r /usr/share/doc/apt /usr/share/doc/bash "$W/pmnt/a/" 2>/dev/null || cp -r /usr/share/doc "$W/pmnt/a/"
dd if=/dev/urandom of="$W/pmnt/a/big" bs=1M count=24 status=none
(cd "$W/pmnt" && find a -type f -print0 | sort -z | xargs -0 sha256sum) >"$W/sums-p"
sync -f "$W/pmnt"
! "$STRIA" volume convert pv --layout tiered:ec:4+2 --pool "$POOL" 2>"$W/convert.err" || { echo "a conversion under a mounted file system was taken" >&2; exit 1; }
grep -q "client(s) attached" "$W/convert.err" || { cat "$W/convert.err" >&2; exit 1; }
umount "$W/pmnt"; losetup -d "$PL"; umount "$W/pfuse"; wait "$PFUSE"
nbdcopy "$(uri pv)" "$W/pv-before.img"
"$STRIA" volume convert pv --layout tiered:ec:4+2 --pool "$POOL"
"$STRIA" volume show pv --pool "$POOL" | grep -q "^tiered volume pv (tiered:ec:4+2)" || { "$STRIA" volume show pv --pool "$POOL" >&2; exit 1; }
qemu-img compare -f raw -F raw "$W/pv-before.img" "$(uri pv)"
nbdfuse "$W/pfuse" "$(uri pv)" &
PFUSE=$!
for _ in $(seq 50); do [ -e "$W/pfuse/nbd" ] && break; sleep 0.1; done
PL=$(losetup -f --show --direct-io=on "$W/pfuse/nbd")
fsck.ext4 -fn "$PL"
mount "$PL" "$W/pmnt"
(cd "$W/pmnt" && sha256sum --quiet -c "$W/sums-p") || { echo "pv does not hold its files after the conversion" >&2; exit 1; }
mkdir "$W/pmnt/b"; dd if=/dev/urandom of="$W/pmnt/b/after" bs=1M count=8 status=none
umount "$W/pmnt"; fsck.ext4 -fn "$PL"; losetup -d "$PL"; umount "$W/pfuse"; wait "$PFUSE"
"$STRIA" snapshot create pv s --pool "$POOL" >/dev/null
nbdcopy "$(uri pv)" "$W/pv-at-s.img"
stop; start
qemu-img compare -f raw -F raw "$W/pv-at-s.img" "$(uri pv@s)"
qemu-img compare -f raw -F raw "$W/pv-at-s.img" "$(uri pv)"
# Its snapshot would go with it: refused, naming it, and nothing changes until the command says so.
! "$STRIA" volume delete pv --pool "$POOL" 2>"$W/delete.err" || { echo "a volume with a snapshot was deleted without --with-snapshots" >&2; exit 1; }
grep -q "has 1 snapshot(s) (s)" "$W/delete.err" || { cat "$W/delete.err" >&2; exit 1; }
qemu-img compare -f raw -F raw "$W/pv-at-s.img" "$(uri pv@s)"
"$STRIA" volume delete pv --with-snapshots --pool "$POOL"
rm -f "$W/pv-before.img" "$W/pv-at-s.img"

log "kill -9 of stria serve amid a conversion: the volume comes back plain or converted, with its bytes"
# A conversion of 384 MiB is timed first (T); then four rounds, each killed 0.3, 0.6, 0.9 and
# 1.2 x T (and a random 0-99 ms) into one, so that kills land before and after its commit on a
# quiet or a loaded machine alike: after the restart the volume equals the data written to it,
# of either kind, and no copy (`kv.convert`) is left behind.
head -c 384M /dev/urandom >"$W/kv.img"
"$STRIA" volume create kv --pool "$POOL" --size 384M --layout ec:4+2 >/dev/null
nbdcopy "$W/kv.img" "$(uri kv)"
t0=$(date +%s.%N)
"$STRIA" volume convert kv --layout tiered:ec:4+2 --pool "$POOL"
T=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }')
"$STRIA" volume delete kv --pool "$POOL" >/dev/null
for share in 0.3 0.6 0.9 1.2; do
  "$STRIA" volume create kv --pool "$POOL" --size 384M --layout ec:4+2 >/dev/null
  nbdcopy "$W/kv.img" "$(uri kv)"
  delay=$(awk -v t="$T" -v s="$share" -v r="$RANDOM" 'BEGIN { printf "%.3f", t * s + r % 100 / 1000 }')
  "$STRIA" volume convert kv --layout tiered:ec:4+2 --pool "$POOL" >/dev/null 2>&1 &
  CONV=$!
  sleep "$delay"
  kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
  # (Killed before it connected, the command found no server and converted in its own process.)
  wait "$CONV" 2>/dev/null || true
  rm -f "$SOCK" "$POOL/stria.sock"
  start
  kind=$("$STRIA" volume show kv --pool "$POOL" | awk 'NR == 1 { print ($1 == "volume") ? "plain" : $1 }')
  qemu-img compare -q -f raw -F raw "$W/kv.img" "$(uri kv)" || { echo "kv lost data in a conversion killed after $delay s ($kind)" >&2; exit 1; }
  ! "$STRIA" volume show kv.convert.meta --pool "$POOL" >/dev/null 2>&1 || { echo "a killed conversion left its copy" >&2; exit 1; }
  echo "killed $delay s into a conversion that took $T s uncut: back as a $kind volume with its bytes"
  "$STRIA" volume delete kv --pool "$POOL" >/dev/null
done
rm -f "$W/kv.img"

log "ext4 on tiered:ec:4+2 grown online under fio, then grown with resize2fs; shrunk after resize2fs -M, its snapshot kept"
# The volume grows while a client has it mounted and fio writes and verifies on it; the file
# system then grows with resize2fs over a new NBD connection (this VM's kernel has neither nbd
# nor device-mapper, so the loop device over nbdfuse cannot see a new size while mounted: the
# file system's own growth is offline here, the volume's is online). Then the file system is
# shrunk (resize2fs -M) and the volume after it (--allow-shrink); fsck and the files' sums hold.
"$STRIA" volume create gv --pool "$POOL" --size 256M --layout tiered:ec:4+2 --cache-size 48M >/dev/null
mkdir -p "$W/gfuse" "$W/gmnt"
# nbd_loop EXPORT DIR PID_VAR LOOP_VAR: EXPORT through nbdfuse at DIR and a loop device over it
# (their pid and device in the variables named).
nbd_loop() {
  local -n nl_pid=$3 nl_dev=$4
  nbdfuse "$2" "$(uri "$1")" &
  nl_pid=$!
  for _ in $(seq 50); do [ -e "$2/nbd" ] && break; sleep 0.1; done
  nl_dev=$(losetup -f --show --direct-io=on "$2/nbd")
}
gv_attach() { nbd_loop gv "$W/gfuse" GFUSE GL; }
gv_detach() { losetup -d "$GL"; umount "$W/gfuse"; wait "$GFUSE"; }
gv_attach
mkfs.ext4 -q -F "$GL"
mount "$GL" "$W/gmnt"
mkdir "$W/gmnt/a"; cp -r /usr/share/doc/bash "$W/gmnt/a/" 2>/dev/null || true
dd if=/dev/urandom of="$W/gmnt/a/big" bs=1M count=48 status=none
sync -f "$W/gmnt"
"$STRIA" snapshot create gv g0 --pool "$POOL" >/dev/null   # it keeps its 256 MiB through the growth
fio --name=grow --directory="$W/gmnt" --verify_state_save=0 --size=64M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 \
  --verify=crc32c --verify_fatal=1 --verify_backlog=512 >"$W/fio-grow.log" 2>&1 &
FIO=$!
sleep 1
"$STRIA" volume resize gv --size 768M --pool "$POOL" >/dev/null
wait "$FIO" || { cat "$W/fio-grow.log" >&2; echo "fio verify failed across gv's growth" >&2; exit 1; }
rm "$W/gmnt/grow.0.0"
(cd "$W/gmnt" && find a -type f -print0 | sort -z | xargs -0 sha256sum) >"$W/sums-g"
cp "$W/sums-g" "$W/sums-g0"   # files A, unchanged since g0
umount "$W/gmnt"; gv_detach
[ "$(nbdinfo --size "$(uri gv)")" = $((768 << 20)) ] || { echo "gv: a new connection does not see 768 MiB" >&2; exit 1; }
[ "$(nbdinfo --size "$(uri gv@g0)")" = $((256 << 20)) ] || { echo "gv@g0 does not keep its 256 MiB" >&2; exit 1; }
"$STRIA" snapshot list gv --pool "$POOL" --json |
  python3 -c 'import json, sys; assert [s for s in json.load(sys.stdin) if s["name"] == "g0"][0]["size_bytes"] == 256 << 20' ||
  { "$STRIA" snapshot list gv --pool "$POOL" --json >&2; echo "snapshot list: gv@g0 is not 256 MiB" >&2; exit 1; }
gv_attach
# e2fsck -fy, not -n: resize2fs wants a check recorded since the last mount (-n records none, so
# the step passed only when mkfs and the mount fell in one second); a repair exits 1 and fails.
e2fsck -fy "$GL" >/dev/null
resize2fs "$GL" >"$W/resize2fs.log" 2>&1 || { cat "$W/resize2fs.log" >&2; exit 1; }
mount "$GL" "$W/gmnt"
blocks=$(df -B1M --output=size "$W/gmnt" | tail -1 | tr -d ' ')
[ "$blocks" -gt 600 ] || { echo "gv: ext4 is $blocks MiB after resize2fs to 768 MiB" >&2; exit 1; }
(cd "$W/gmnt" && sha256sum --quiet -c "$W/sums-g") || { echo "gv: files changed across the growth" >&2; exit 1; }
# 400 MiB more: most of it lands past the old end.
mkdir "$W/gmnt/b"; dd if=/dev/urandom of="$W/gmnt/b/past-the-old-end" bs=1M count=400 status=none
dd if=/dev/urandom of="$W/gmnt/b/kept" bs=1M count=32 status=none
(cd "$W/gmnt" && sha256sum b/past-the-old-end) >"$W/sums-big"
(cd "$W/gmnt" && sha256sum b/kept) >>"$W/sums-g"
umount "$W/gmnt"; fsck.ext4 -fn "$GL"; gv_detach
stop; start
gv_attach
fsck.ext4 -fn "$GL"
mount "$GL" "$W/gmnt"
(cd "$W/gmnt" && sha256sum --quiet -c "$W/sums-g" "$W/sums-big") || { echo "gv: files changed across a restart" >&2; exit 1; }
rm "$W/gmnt/b/past-the-old-end"
umount "$W/gmnt"
# A clone of g0 (256 MiB) grows past gv's 768 MiB to 1 GiB (the family's map grows; gv keeps
# its size): the blocks it gains read as zeros although gv holds data below 768 MiB; its ext4
# grows with resize2fs and keeps files A; then it shrinks after resize2fs -M (--allow-shrink)
# and still holds them.
"$STRIA" volume clone gv@g0 gvc --pool "$POOL" >/dev/null
"$STRIA" volume list --pool "$POOL" --json |
  python3 -c 'import json, sys; assert [v for v in json.load(sys.stdin) if v["name"] == "gvc"][0]["size_bytes"] == 256 << 20' ||
  { "$STRIA" volume list --pool "$POOL" --json >&2; echo "volume list: gvc is not 256 MiB" >&2; exit 1; }
"$STRIA" volume resize gvc --size 1G --pool "$POOL" >/dev/null
[ "$(nbdinfo --size "$(uri gvc)")" = $((1024 << 20)) ] || { echo "gvc: a new connection does not see 1 GiB" >&2; exit 1; }
[ "$(nbdinfo --size "$(uri gv)")" = $((768 << 20)) ] || { echo "gv changed size with its clone's growth" >&2; exit 1; }
out=$(qemu-io -f raw -r "$(uri gvc)" -c 'read -P 0 256M 768M' 2>&1)
! grep -q -i "verification failed\|error" <<<"$out" || { echo "gvc's new blocks are not zeros: $out" >&2; exit 1; }
# Written past gv's end (before the file system grows there): read back, then zeros again.
out=$(qemu-io -f raw "$(uri gvc)" -c 'write -P 0xab 900M 8M' -c 'read -P 0xab 900M 8M' -c 'write -z 900M 8M' -c 'read -P 0 900M 8M' 2>&1)
! grep -q -i "verification failed\|error" <<<"$out" || { echo "gvc past gv's end: $out" >&2; exit 1; }
mkdir -p "$W/gcfuse"
gvc_attach() { nbd_loop gvc "$W/gcfuse" GCFUSE GCL; }
gvc_detach() { losetup -d "$GCL"; umount "$W/gcfuse"; wait "$GCFUSE"; }
gvc_attach
# g0 was taken with the file system mounted (crash-consistent): the check may replay its journal
# and fix what a mount would have (exit status 1); anything worse (2 and up) fails.
rc=0; e2fsck -fy "$GCL" >"$W/e2fsck.log" 2>&1 || rc=$?
[ "$rc" -le 1 ] || { cat "$W/e2fsck.log" >&2; exit 1; }
resize2fs "$GCL" >"$W/resize2fs.log" 2>&1 || { cat "$W/resize2fs.log" >&2; exit 1; }
mount "$GCL" "$W/gmnt"
blocks=$(df -B1M --output=size "$W/gmnt" | tail -1 | tr -d ' ')
[ "$blocks" -gt 900 ] || { echo "gvc: ext4 is $blocks MiB after resize2fs to 1 GiB" >&2; exit 1; }
(cd "$W/gmnt" && sha256sum --quiet -c "$W/sums-g0") || { echo "gvc does not hold g0's files" >&2; exit 1; }
dd if=/dev/urandom of="$W/gmnt/a/clone-only" bs=1M count=120 status=none
rm "$W/gmnt/a/clone-only"
umount "$W/gmnt"
e2fsck -fy "$GCL" >/dev/null
resize2fs -M "$GCL" >"$W/resize2fs.log" 2>&1 || { cat "$W/resize2fs.log" >&2; exit 1; }
fs_bytes=$(dumpe2fs -h "$GCL" 2>/dev/null | awk -F: '/^Block count/ {c=$2} /^Block size/ {s=$2} END {print c * s}')
gvc_detach
! "$STRIA" volume resize gvc --size $(( fs_bytes / 1048576 + 16 ))M --pool "$POOL" 2>/dev/null || { echo "a clone shrank without --allow-shrink" >&2; exit 1; }
"$STRIA" volume resize gvc --size $(( fs_bytes / 1048576 + 16 ))M --allow-shrink --pool "$POOL" >/dev/null
gvc_attach
fsck.ext4 -fn "$GCL"
mount -o ro "$GCL" "$W/gmnt"
(cd "$W/gmnt" && sha256sum --quiet -c "$W/sums-g0") || { echo "gvc: files changed across its shrink" >&2; exit 1; }
umount "$W/gmnt"; gvc_detach
echo "gvc: clone of gv@g0 grown 256 MiB -> 1 GiB (past gv's 768 MiB), ext4 grown; shrunk to $(( fs_bytes / 1048576 + 16 )) MiB after resize2fs -M"
"$STRIA" volume delete gvc --pool "$POOL"
# Shrink: the file system first, then the volume (refused without --allow-shrink), with its
# snapshot g0 kept: g0 keeps its size and reads byte for byte as before.
g0_sum=$(nbdcopy "$(uri gv@g0)" - | sha256sum)
e2fsck -fy "$GL" >/dev/null
resize2fs -M "$GL" >"$W/resize2fs.log" 2>&1 || { cat "$W/resize2fs.log" >&2; exit 1; }
fs_bytes=$(dumpe2fs -h "$GL" 2>/dev/null | awk -F: '/^Block count/ {c=$2} /^Block size/ {s=$2} END {print c * s}')
gv_detach
new=$(( (fs_bytes / 1048576 + 16) ))M
! "$STRIA" volume resize gv --size "$new" --pool "$POOL" 2>"$W/shrink.err" || { echo "a shrink without --allow-shrink was taken" >&2; exit 1; }
grep -q "allow-shrink" "$W/shrink.err" || { cat "$W/shrink.err" >&2; exit 1; }
"$STRIA" volume resize gv --size "$new" --allow-shrink --pool "$POOL" >/dev/null
echo "gv: 256 MiB -> 768 MiB online under fio, ext4 grown; ext4 shrunk to $((fs_bytes >> 20)) MiB, the volume to $new with its snapshot g0"
gv_attach
fsck.ext4 -fn "$GL"
mount -o ro "$GL" "$W/gmnt"
(cd "$W/gmnt" && sha256sum --quiet -c "$W/sums-g") || { echo "gv: files changed across the shrink" >&2; exit 1; }
umount "$W/gmnt"; gv_detach
[ "$(nbdinfo --size "$(uri gv@g0)")" = $((256 << 20)) ] || { echo "gv@g0 changed size with gv's shrink" >&2; exit 1; }
[ "$(nbdcopy "$(uri gv@g0)" - | sha256sum)" = "$g0_sum" ] || { echo "gv@g0 changed across gv's shrink" >&2; exit 1; }
"$STRIA" snapshot delete gv g0 --pool "$POOL" >/dev/null
"$STRIA" scrub gv --pool "$POOL"
"$STRIA" volume delete gv --pool "$POOL"

log "log: space a client TRIMs goes back to the pool (compaction, then a resize down)"
# 960 MiB written sequentially grow lv's space past the 16 segments (32 MiB each) it starts
# with; then all but every eighth 4 MiB is discarded, so every segment keeps some live data and
# only compaction can empty the end of the space.
qemu-io -f raw "$(uri lv)" -c 'write -P 0x3c 0 960M' >/dev/null
grown=$(counter lv segments)
[ "$grown" -gt 16 ] || { echo "lv: the space did not grow for 960 MiB: $grown segments" >&2; exit 1; }
discards=()
for i in $(seq 0 239); do
  [ $((i % 8)) = 0 ] || discards+=(-c "discard $((i * 4))M 4M")
done
qemu-io -f raw "$(uri lv)" "${discards[@]}" >/dev/null
for _ in $(seq 300); do
  [ "$(counter lv segments)" -lt $((grown / 2)) ] && break
  sleep 0.1
done
now=$(counter lv segments); back=$(counter lv segments_given_back); moved=$(counter lv gc_moved_blocks)
echo "lv: space $grown -> $now segments ($back given back, $moved blocks moved by GC and compaction)"
[ "$now" -lt $((grown / 2)) ] || { echo "lv: the TRIMmed space was not given back: $now of $grown segments" >&2; exit 1; }
# What was kept reads back; what was discarded reads as zeros.
reads=()
for i in $(seq 0 239); do
  if [ $((i % 8)) = 0 ]; then reads+=(-c "read -P 0x3c $((i * 4))M 4M"); else reads+=(-c "read -P 0 $((i * 4))M 4M"); fi
done
out=$(qemu-io -f raw "$(uri lv)" "${reads[@]}" 2>&1)
! grep -q -i "pattern verification failed\|error" <<<"$out" || { grep -i -m5 "failed\|error" <<<"$out" >&2; exit 1; }
"$STRIA" scrub lv --pool "$POOL"

log "tiered: a fast drive fails while fio writes and verifies; cache and metadata go on mirrored-degraded, then rebuild"
# (In $W: fio leaves its verify state file in the working directory.)
( cd "$W" && exec fio --name=tvf --ioengine=nbd --uri="$(uri tv)" --rw=randwrite --bs=4k --iodepth=16 --size=128M \
    --offset=256M --verify=crc32c --verify_fatal=1 >"$W/fio-tvf.log" 2>&1 ) &
FIOF=$!
sleep 1
"$STRIA" drive fail 1 --pool "$POOL"
wait $FIOF || { cat "$W/fio-tvf.log" >&2; echo "tiered: I/O failed after a fast drive failure" >&2; exit 1; }
state=$(tier state)
[ "$state" = degraded ] || { echo "tv should be degraded with a fast drive failed, is $state" >&2; exit 1; }
"$STRIA" drive replace 1 --pool "$POOL"
for _ in $(seq 600); do state=$(tier state); [ "$state" = healthy ] && break; sleep 0.1; done
[ "$state" = healthy ] || { echo "tv: rebuild of the fast drive did not finish: $state" >&2; exit 1; }
"$STRIA" scrub tv --pool "$POOL"

log "client recipe on ec:4+2 with a drive failed mid-run"
"$ROOT/tests/nbd/clients.sh" "$SOCK" ecd >"$W/recipe-ecd.log" 2>&1 & RECIPE=$!
sleep 4
slot=$("$STRIA" volume show ecd --pool "$POOL" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["segments"][0]["members"][2]["drive"])')
# --force: the raid0 volume r0 also has a chunk on every capacity drive and is lost with it
# (without --force stria refuses, naming r0).
"$STRIA" drive fail "$slot" --force --pool "$POOL"
wait $RECIPE || { tail -50 "$W/recipe-ecd.log" >&2; exit 1; }
grep -q NBD_CLIENTS_OK "$W/recipe-ecd.log"
state=$("$STRIA" volume show ecd --pool "$POOL" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
[ "$state" = degraded ] || { echo "ecd should be degraded, is $state" >&2; exit 1; }
log "replace the failed drive; rebuild runs in the daemon while a client reads"
"$STRIA" drive replace "$slot" --force --pool "$POOL"   # --force: r0 has nothing to rebuild from
nbdcopy "$(uri ecd)" "$W/during-rebuild.img"
for _ in $(seq 600); do
  state=$("$STRIA" volume show ecd --pool "$POOL" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [ "$state" = healthy ] && break; sleep 0.1
done
[ "$state" = healthy ] || { echo "rebuild did not finish: $state" >&2; exit 1; }
nbdcopy "$(uri ecd)" "$W/after-rebuild.img"
cmp "$W/during-rebuild.img" "$W/after-rebuild.img"
rm -f "$W"/*.img
"$STRIA" scrub ecd --pool "$POOL"

log "drive error counters: cleared through the daemon"
"$STRIA" drive clear-errors --all --pool "$POOL"
status_json | /usr/bin/python3 -c '
import json, sys
bad = [d["id"] for d in json.load(sys.stdin)["drives"] if d["read_errors"] or d["write_errors"] or d["checksum_repairs"]]
assert not bad, f"error counters not cleared on drives {bad}"'

log "python3-libnbd protocol tests against stria"
NBD_SOCKET=$SOCK NBD_EXPORT=ec NBD_ZERO_EXACT=0 /usr/bin/python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/nbd" -k "not tls"

log "clean shutdown on SIGTERM"
stop

log "kill -9 in the middle of writes: flushed and FUA writes survive"
start
qemu-io -f raw "$(uri ec)" -c 'write -P 0x5a 0 4M' -c flush -c 'write -f -P 0x6b 8M 1M' >/dev/null
# More writes in flight when the process dies.
( fio --name=bg --ioengine=nbd --uri="$(uri ec)" --rw=randwrite --bs=4k --iodepth=16 --size=64M \
      --offset=64M --time_based --runtime=30 >/dev/null 2>&1 || true ) &
FIO=$!
sleep 2
kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
wait $FIO || true
rm -f "$SOCK" "$POOL/stria.sock"
start
out=$(qemu-io -f raw "$(uri ec)" -c 'read -P 0x5a 0 4M' -c 'read -P 0x6b 8M 1M' 2>&1)
echo "$out"
if echo "$out" | grep -qi "verification failed\|error"; then echo "data lost after kill -9" >&2; exit 1; fi
[ "$(echo "$out" | grep -c '^read ')" = 2 ] || { echo "reads after kill -9 did not complete" >&2; exit 1; }
"$STRIA" scrub ec --pool "$POOL"

log "tiered: kill -9 with writes in flight and destage and GC running; every acknowledged write is back"
# fio writes with crc32c headers and saves its verify state when interrupted (SIGINT: it reaps
# what is in flight, so the state names exactly the acknowledged writes); a second fio keeps
# writing to the other half of the volume, so the server dies with requests in flight.
mkdir -p "$W/fio"
( cd "$W/fio" && exec fio --name=tv --ioengine=nbd --uri="$(uri tv)" --rw=randwrite --bs=4k --iodepth=16 \
    --size=512M --rate_iops=6000 --verify=crc32c --do_verify=0 --verify_state_save=1 >fio-write.log 2>&1 ) &
FIOW=$!
( fio --name=bg --ioengine=nbd --uri="$(uri tv)" --rw=randwrite --bs=64k --iodepth=8 --offset=512M \
      --size=512M --time_based --runtime=60 >/dev/null 2>&1 || true ) &
FIO=$!
sleep 4
kill -INT $FIOW; wait $FIOW || true
grep -q "err= 0" "$W/fio/fio-write.log" || { cat "$W/fio/fio-write.log" >&2; exit 1; }
ls "$W"/fio/*verify.state >/dev/null || { echo "fio saved no verify state" >&2; exit 1; }
echo "tv before the kill: $(tier cache_live_blocks) blocks cached, $(tier destaged_blocks) destaged, $(tier gc_moved_blocks) moved by GC"
kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
wait $FIO || true
rm -f "$SOCK" "$POOL/stria.sock"
start
( cd "$W/fio" && fio --name=tv --ioengine=nbd --uri="$(uri tv)" --rw=randwrite --bs=4k --iodepth=16 --size=512M \
    --verify=crc32c --verify_only --verify_state_load=1 --verify_fatal=1 >fio-verify.log 2>&1 ) \
  || { cat "$W/fio/fio-verify.log" >&2; echo "tiered: acknowledged writes lost after kill -9" >&2; exit 1; }
grep -E "read:" "$W/fio/fio-verify.log"
"$STRIA" scrub tv --pool "$POOL"
stop

log "all client tests passed"
