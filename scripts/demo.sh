#!/usr/bin/env bash
# The main job on an embedded default: builds stria, creates ./stria-data on first run
# (2 fast + 6 capacity file-backed drives, volume vol0), serves it over NBD on
# ./stria-data/nbd.sock and 127.0.0.1:10809, and prints the URIs and example client commands.
# Stop with Ctrl-C. Extra arguments go to `stria up` (see `stria up --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p stria
exec target/release/stria up "$@"
