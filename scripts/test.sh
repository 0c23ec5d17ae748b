#!/usr/bin/env bash
# Runs every test of stria on a fresh machine: installs what is missing (Debian packages, the
# pinned Rust toolchain), checks formatting and lints, runs the unit, scenario and seeded crash
# tests, then the real-client tests (qemu, libnbd, fio, ext4 over nbdfuse) against `stria serve`,
# the metrics (promtool, a real Prometheus) and the dashboard (headless Chromium).
# Exits non-zero on the first failure. Usage: scripts/test.sh [--quick]  (--quick: no real clients)
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=${1:-}

step() { printf '\n==== %s (at %d s) ====\n' "$*" "$SECONDS"; }

step "system packages"
PKGS=(libnbd-bin qemu-utils fio nbdkit python3-libnbd python3-pytest e2fsprogs fuse3 util-linux openssl
      procps psmisc curl ca-certificates build-essential pkg-config prometheus chromium
      etcd-server etcd-client protobuf-compiler libprotobuf-dev libiscsi-bin qemu-block-extra)
# etcd-server: the cluster tests start their own etcd members; protobuf: the etcd-client crate's
# build compiles etcd's protos.
# node and npm: tests/ui/run.sh installs them when the commands are missing (a nodesource
# nodejs package provides npm and conflicts with Debian's)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # No service may start from a package's install script (etcd-server's would start a
  # system-wide etcd): policy-rc.d answers "not allowed" while the packages install.
  policy=/usr/sbin/policy-rc.d
  placed=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && placed=1
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  [ -z "$placed" ] || $SUDO rm -f "$policy"
fi

step "rust toolchain (pinned in rust-toolchain.toml)"
if ! command -v cargo >/dev/null; then
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
rustup show active-toolchain >/dev/null   # installs the pinned toolchain and components if missing
cargo --version

# A test run builds once: incremental state would only multiply the disk it needs (2.2 GiB of
# target/ after a whole run without it; a debug target with it and full debug info took 29 GiB).
export CARGO_INCREMENTAL=0

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "unit, scenario and seeded crash tests"
cargo test --workspace --locked

if [ "$QUICK" = "--quick" ]; then
  echo "quick run: real-client tests skipped"; exit 0
fi

step "real clients against the NBD server alone (memory exports: errors, read-only, TLS)"
CARGO_TARGET_DIR=$PWD/target tests/nbd/run.sh

step "real clients against stria serve"
cargo build --release --locked -p stria
tests/clients/run.sh target/release/stria

step "iSCSI: libiscsi's iscsi-test-cu (raid1, thin tiered), qemu's iscsi:// driver, ext4 and fsck, a snapshot's LUN"
tests/iscsi/run.sh target/release/stria

step "metrics: promtool on a scrape, a real Prometheus scraping the daemon"
tests/metrics/run.sh target/release/stria

step "dashboard in headless Chromium (playwright-core): checked against status --json, scrub, refusals"
tests/ui/run.sh target/release/stria

step "an old copy of a drive put back is left out (ec:4+2, tiered), then rebuilt in place"
tests/clients/stale_drive.sh target/release/stria

step "crash loop: kill -9 of stria serve under a verifying client, every layout and scenario (2 rounds each)"
# The long run (tests/crash/run.sh target/release/stria --rounds 200) is quoted in the notes.
tests/crash/run.sh target/release/stria --rounds 2 --jobs 2

step "cluster: four stria nodes and a three-member etcd, kill -9 / kill -STOP of an owner, a node away past the out-time, etcd majority paused"
# Register workload checked for lost acknowledged writes and linearizability, then every member
# back in service (rebuilt in place or on the free node) with no operator (tests/cluster/).
# The long run (--rounds 50) is quoted in the notes.
tests/cluster/run.sh target/release/stria --rounds 1

step "cluster: the owner's node cut off by a partition (network namespaces the test makes and deletes)"
tests/cluster/run.sh target/release/stria --rounds 1 --netns --scenarios partition

step "all tests passed"
