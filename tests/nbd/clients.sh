#!/bin/bash
# Runs the shared real-client recipe (nbdinfo, qemu-io, nbdcopy, qemu-img, fio, nbdfuse + ext4)
# against a running server. Usage: tests/nbd/clients.sh SOCKET [EXPORT]
# The export must be writable and at least 1 GiB; needs root (losetup, mount).
set -euo pipefail
RECIPE=${NBD_RECIPE:-/work/shared/recipes/nbd-clients.sh}
[ $# -ge 1 ] || { echo "usage: $0 SOCKET [EXPORT]" >&2; exit 2; }
[ -S "$1" ] || { echo "$0: $1 is not a socket" >&2; exit 2; }
LOG=$(mktemp /tmp/nbd-clients-log.XXXX)
trap 'rm -f "$LOG"' EXIT
if bash "$RECIPE" "$1" "${2:-}" >"$LOG" 2>&1 && grep -q '^NBD_CLIENTS_OK$' "$LOG"; then
  echo "clients: NBD_CLIENTS_OK"
else
  echo "clients: FAILED; last lines of the recipe log:" >&2
  tail -40 "$LOG" >&2
  exit 1
fi
