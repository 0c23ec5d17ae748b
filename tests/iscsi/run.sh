#!/usr/bin/env bash
# Real iSCSI clients against `stria serve --iscsi` (docs/iscsi.md): discovery with iscsi-ls,
# libiscsi's conformance suite (iscsi-test-cu --dataloss --test=ALL) on a raid1 and a thin
# tiered:ec:4+2 volume, judged by its CUnit summary, qemu-io patterns and qemu-img convert and
# compare through qemu's iscsi:// driver, ext4 made and checked through qemu's driver (qemu-nbd
# bridges the LUN to nbdfuse and a loop device), a snapshot's LUN refusing writes, and CHAP
# (one-way and mutual) with libiscsi and qemu.
# Usage: tests/iscsi/run.sh PATH/TO/stria
# Needs root (losetup, mount) and libiscsi-bin, qemu-utils, qemu-block-extra, nbdfuse.
# Cleans up after itself, also on failure.
set -euo pipefail
STRIA=$(realpath "${1:?usage: run.sh PATH/TO/stria}")
W=$(mktemp -d /dev/shm/stria-iscsi.XXXX)
POOL=$W/pool
SOCK=$W/nbd.sock
PID=
BRIDGE=
export STRIA_LOG=${STRIA_LOG:-warn}

# The suite's tests stria is known to fail, with the reason (docs/iscsi.md, "libiscsi"):
#   SCSI.GetLBAStatus.UnmapSingle: its second loop asks for LBA i+1 and expects the first
#   descriptor at i + (logical blocks per physical block); SBC-4 puts it at the LBA asked for,
#   which is what stria answers (the test agrees only with targets that report 512-byte
#   physical blocks).
KNOWN_FAILURES="GetLBAStatus.UnmapSingle"

cleanup() {
  set +e
  [ -z "$BRIDGE" ] || kill "$BRIDGE" 2>/dev/null
  for m in $(grep -o "$W[^ ]*" /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null; done
  for l in $(losetup -j "$W/fuse/nbd" -O NAME -n 2>/dev/null); do losetup -d "$l"; done
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -9 "$PID"; wait "$PID" 2>/dev/null; fi
  rm -rf "$W"
}
trap cleanup EXIT INT TERM

log() { printf '\n---- %s ----\n' "$*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

log "pool: 2 fast + 6 capacity sparse drives on tmpfs"
"$STRIA" pool create --pool "$POOL" --fast 2 --capacity 6 --drive-size 2G >/dev/null
"$STRIA" volume create r1 --pool "$POOL" --size 256M --layout raid1 >/dev/null
"$STRIA" volume create ec --pool "$POOL" --size 512M --layout ec:4+2 >/dev/null
"$STRIA" volume create tv --pool "$POOL" --size 256M --layout tiered:ec:4+2 --cache-size 48M >/dev/null
PORT=$(free_port)
HTTP=$(free_port)
"$STRIA" serve --pool "$POOL" --nbd "unix:$SOCK" --iscsi "tcp:127.0.0.1:$PORT" --http "tcp:127.0.0.1:$HTTP" >"$W/serve.log" 2>&1 &
PID=$!
for _ in $(seq 400); do
  [ -S "$POOL/stria.sock" ] && (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.025
done
lun() { echo "iscsi://127.0.0.1:$PORT/$IQN:$1/0"; }

log "discovery: every volume is a target"
iscsi-ls "iscsi://127.0.0.1:$PORT" | tee "$W/ls.txt"
# Target names are iqn.2026-11.io.stria:POOL:VOLUME: the daemon prints the URI of each listener.
IQN=$(sed -n "s|^iSCSI: iscsi://127.0.0.1:$PORT/\(.*\):VOLUME/0\$|\1|p" "$W/serve.log")
[ -n "$IQN" ] || { cat "$W/serve.log"; fail "stria serve printed no iSCSI URI"; }
for v in r1 ec tv; do grep -q "Target:$IQN:$v Portal:127.0.0.1:$PORT,1" "$W/ls.txt" || fail "iscsi-ls does not list $v"; done

conformance() {  # VOLUME: runs the suite, checks its summary against the known failures
  local v=$1 out=$W/cu-$1.log
  iscsi-test-cu --dataloss --normal --test=ALL "$(lun "$v")" >"$out" 2>&1 || true
  local summary
  summary=$(grep -E '^\s+tests\s+[0-9]+' "$out") || { tail -30 "$out"; fail "iscsi-test-cu on $v printed no summary"; }
  read -r _ total ran passed failed _ <<<"$summary"
  echo "iscsi-test-cu on $v: $passed of $total passed, $failed failed (ran $ran)"
  local failures
  failures=$(grep -oE 'Suite [A-Za-z0-9_]+, Test [A-Za-z0-9_]+ had failures' "$out" | awk '{print $2 "." $4}' | tr -d ',' | sort)
  for f in $failures; do
    case " $KNOWN_FAILURES " in
      *" $f "*) echo "  known failure: $f" ;;
      *)
        # The suite's own words on it (kept: the working directory goes at exit).
        { grep -A12 "Test: ${f#*.} " "$out" | head -30; } || true
        cp "$out" "${TMPDIR:-/tmp}/stria-iscsi-test-cu-$v.log" 2>/dev/null || true
        fail "iscsi-test-cu on $v: $f failed (whole output: ${TMPDIR:-/tmp}/stria-iscsi-test-cu-$v.log)" ;;
    esac
  done
  [ "$ran" = "$total" ] || fail "iscsi-test-cu on $v ran $ran of $total tests"
  # Every failure named above: a test that failed without the suite's "had failures" line is
  # not taken for a known one.
  [ "$failed" = "$(wc -w <<<"$failures")" ] || {
    cp "$out" "${TMPDIR:-/tmp}/stria-iscsi-test-cu-$v.log" 2>/dev/null || true
    grep -B2 -A12 -iE 'fail|error' "$out" | head -60 || true
    fail "iscsi-test-cu on $v: $failed failed, $(wc -w <<<"$failures") named (whole output: ${TMPDIR:-/tmp}/stria-iscsi-test-cu-$v.log)"
  }
}
log "libiscsi's iscsi-test-cu --dataloss --test=ALL on raid1"
conformance r1
log "libiscsi's iscsi-test-cu --dataloss --test=ALL on tiered:ec:4+2 (thin)"
conformance tv

log "metrics: the target's counters and the volumes' requests (shared with NBD), promtool"
curl -sf "http://127.0.0.1:$HTTP/metrics" >"$W/metrics.txt"
grep -E '^stria_iscsi_connections\{phase="full_feature"\} 0$' "$W/metrics.txt" || fail "no iSCSI session gauge at 0"
# The suite's login tests refuse some logins on purpose.
awk '/^stria_iscsi_failed_logins_total / { exit !($2 > 0) }' "$W/metrics.txt" || fail "no failed logins counted"
grep -E '^stria_volume_ops_total\{volume="r1",op="read"\} [1-9]' "$W/metrics.txt" || fail "the LUN's reads are not counted"
if command -v promtool >/dev/null; then promtool check metrics <"$W/metrics.txt" || fail "promtool"; fi

log "qemu-io patterns through iscsi:// on ec:4+2"
qemu-io -f raw -c 'write -P 0xa5 0 4M' -c 'write -P 0x5a 7M 512' -c 'write -z 9M 1M' \
  -c 'read -P 0xa5 0 4M' -c 'read -P 0x5a 7M 512' -c 'read -P 0 9M 1M' "$(lun ec)" >"$W/qio.txt" \
  || { cat "$W/qio.txt"; fail "qemu-io patterns"; }
grep -c "Pattern verification failed" "$W/qio.txt" >/dev/null && fail "qemu-io pattern mismatch"

log "qemu-img convert of an NBD-filled volume into a LUN, compared back"
head -c 64M /dev/urandom >"$W/img.raw"
qemu-img convert -n -f raw -O raw "$W/img.raw" "nbd+unix:///r1?socket=$SOCK"
qemu-img convert -n -f raw -O raw "nbd+unix:///r1?socket=$SOCK" "$(lun ec)"
qemu-img compare -f raw -F raw "nbd+unix:///r1?socket=$SOCK" "$(lun ec)" \
  || fail "qemu-img compare: the LUN differs from the NBD export"

log "ext4 through qemu's iscsi driver: qemu-nbd bridge, nbdfuse, loop, mkfs, files, fsck"
qemu-nbd -f raw --socket="$W/bridge.sock" --persistent "$(lun tv)" &
BRIDGE=$!
for _ in $(seq 200); do [ -S "$W/bridge.sock" ] && break; sleep 0.05; done
mkdir -p "$W/fuse" "$W/mnt"
nbdfuse "$W/fuse" --unix "$W/bridge.sock" &
for _ in $(seq 200); do [ -e "$W/fuse/nbd" ] && break; sleep 0.05; done
LOOP=$(losetup -f --show "$W/fuse/nbd")
mkfs.ext4 -q -F "$LOOP"
mount "$LOOP" "$W/mnt"
head -c 20M /dev/urandom >"$W/file.bin"
for i in 1 2 3; do cp "$W/file.bin" "$W/mnt/f$i"; done
sync
sum=$(sha256sum <"$W/file.bin")
for i in 1 2 3; do [ "$(sha256sum <"$W/mnt/f$i")" = "$sum" ] || fail "f$i differs"; done
umount "$W/mnt"
e2fsck -fn "$LOOP" >"$W/fsck.txt" 2>&1 || { cat "$W/fsck.txt"; fail "e2fsck found errors"; }
losetup -d "$LOOP"
# The loop device lets go of the file a little after it is detached.
for _ in $(seq 100); do umount "$W/fuse" 2>/dev/null && break; sleep 0.1; done
kill "$BRIDGE"; wait "$BRIDGE" 2>/dev/null || true
BRIDGE=

log "a snapshot's LUN: the files read back, writes refused (DATA PROTECT)"
"$STRIA" snapshot create tv s1 --pool "$POOL" >/dev/null
for _ in $(seq 100); do iscsi-ls "iscsi://127.0.0.1:$PORT" | grep -q "$IQN:tv:s1 " && break; sleep 0.1; done
SNAP="iscsi://127.0.0.1:$PORT/$IQN:tv:s1/0"
qemu-img compare -f raw -F raw "$(lun tv)" "$SNAP" || fail "the snapshot differs from its volume"
if qemu-io -f raw -c 'write -P 1 0 4k' "$SNAP" >"$W/snapw.txt" 2>&1 && grep -q "wrote 4096" "$W/snapw.txt"; then
  fail "a write to the snapshot's LUN succeeded"
fi
grep -qi "permission denied\|read-only\|protected" "$W/snapw.txt" || { cat "$W/snapw.txt"; fail "the snapshot's refusal is not a write protection"; }
cat "$W/snapw.txt"
# libiscsi's read-only suite on the snapshot's LUN: every write-like command DATA PROTECT.
iscsi-test-cu --dataloss --verbose --Verbose-scsi --test=SCSI.ReadOnly "$SNAP" >"$W/cu-ro.log" 2>&1 || true
grep -E '^\s+tests\s+' "$W/cu-ro.log"
grep -q "had failures" "$W/cu-ro.log" && { cat "$W/cu-ro.log"; fail "iscsi-test-cu SCSI.ReadOnly on the snapshot"; }
# (The suite skips itself on a writable unit: its write checks must have run.)
grep -q "WRITESAME10 returned CHECK_CONDITION DATA PROTECTION(0x07) WRITE_PROTECTED" "$W/cu-ro.log" \
  || { cat "$W/cu-ro.log"; fail "SCSI.ReadOnly did not run its write checks: the LUN does not look write-protected"; }

log "clean stop"
kill -TERM "$PID"
rc=0; wait "$PID" || rc=$?
PID=
[ "$rc" = 0 ] || { cat "$W/serve.log" >&2; fail "stria serve exited with $rc after SIGTERM"; }
log "CHAP, one-way and mutual: the right secrets log in, anything else is refused"
printf 'initiator-secret-1\n' >"$W/initiator.secret"
printf 'target-secret-22\n' >"$W/target.secret"
"$STRIA" serve --pool "$POOL" --nbd "unix:$SOCK" --iscsi "tcp:127.0.0.1:$PORT" \
  --iscsi-chap-user alice --iscsi-chap-secret-file "$W/initiator.secret" \
  --iscsi-chap-mutual-user stria --iscsi-chap-mutual-secret-file "$W/target.secret" >"$W/serve-chap.log" 2>&1 &
PID=$!
for _ in $(seq 400); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.025; done
refused() { ! "$@" >"$W/chap.txt" 2>&1 || { cat "$W/chap.txt"; fail "CHAP: $* logged in"; }; }
refused iscsi-ls "iscsi://127.0.0.1:$PORT"
grep -q "Authentication failure" "$W/chap.txt" || { cat "$W/chap.txt"; fail "no credentials: not an authentication failure"; }
refused iscsi-ls "iscsi://alice%wrong-secret-xx@127.0.0.1:$PORT"
refused iscsi-ls "iscsi://mallory%initiator-secret-1@127.0.0.1:$PORT"
iscsi-ls "iscsi://alice%initiator-secret-1@127.0.0.1:$PORT" | grep -q "$IQN:r1 " || fail "CHAP: the right secret did not log in"
MUTUAL="iscsi://alice%initiator-secret-1@127.0.0.1:$PORT/$IQN:r1/0?target_user=stria&target_password"
iscsi-inq "$MUTUAL=target-secret-22" | grep -q "Peripheral Device Type:DIRECT_ACCESS" || fail "mutual CHAP did not log in"
refused iscsi-inq "$MUTUAL=target-secret-XX"
grep -q "Invalid CHAP_R response from the target" "$W/chap.txt" || { cat "$W/chap.txt"; fail "mutual CHAP with a wrong target secret"; }
qemu-io -f raw -c 'write -P 0x3c 0 64k' -c 'read -P 0x3c 0 64k' "iscsi://alice%initiator-secret-1@127.0.0.1:$PORT/$IQN:ec/0" | grep -q "read 65536/65536" \
  || fail "qemu through CHAP did not write and read back"
kill -TERM "$PID"
rc=0; wait "$PID" || rc=$?
PID=
[ "$rc" = 0 ] || { cat "$W/serve-chap.log" >&2; fail "stria serve (CHAP) exited with $rc after SIGTERM"; }
echo "iscsi: all passed"
