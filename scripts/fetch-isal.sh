#!/usr/bin/env bash
# Fetch Intel ISA-L 2.31.x (the first release with GFNI erasure-code kernels) from Debian trixie
# into .bench/isal/, for `cargo run --release -p stria-bench --bin stria-bench-ec --` to dlopen as
# the peer to beat.
#
# The system's apt configuration is not touched: a private sources.list, list and cache directory
# live under .bench/isal/apt, and the package is unpacked with `dpkg -x` (never installed).
# Idempotent: if the library is already there, nothing is downloaded.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${ISAL_DIR:-$repo_root/.bench/isal}"
suite="${ISAL_SUITE:-trixie}"
mirror="${ISAL_MIRROR:-http://deb.debian.org/debian}"
lib_dir="$dest/root/usr/lib/x86_64-linux-gnu"

if compgen -G "$lib_dir/libisal.so.2*" >/dev/null; then
    echo "ISA-L already present: $(ls "$lib_dir"/libisal.so.2.* 2>/dev/null | head -n1)"
    exit 0
fi

apt_dir="$dest/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dest/root"
echo "deb $mirror $suite main" >"$apt_dir/sources.list"

apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
)

apt-get "${apt_opts[@]}" update
(cd "$dest" && apt-get "${apt_opts[@]}" download libisal2)

deb="$(ls -t "$dest"/libisal2_*.deb | head -n1)"
dpkg -x "$deb" "$dest/root"
echo "ISA-L unpacked from $(basename "$deb"):"
ls -l "$lib_dir"/libisal.so.2*
