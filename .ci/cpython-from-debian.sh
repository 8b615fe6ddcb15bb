#!/usr/bin/env bash
# Builds a CPython that this Debian (bookworm) does not package, once, from Debian's own source
# package, into a cache folder outside the checkout, and prints the path of its `python3.X`.
#
#   .ci/cpython-from-debian.sh 3.13 ~/.cache/soma/cpython
#
# Why this way: Debian's packages are the only place these machines (a developer's, CI's) can
# fetch code from besides PyPI and crates.io, and bookworm has no 3.13; trixie's source package
# `python3.13` carries the upstream tarball, checked by apt against trixie's signed Release file.
# A private source list (only `deb-src`, only trixie) and private apt state keep the machine's
# own apt configuration untouched: nothing from trixie is ever installed, only its source read.
# The tarball is unpacked without Debian's patches (`--skip-patches`), which fit Debian's own
# file layout (and carry its backported fixes, which a test interpreter can do without); the
# result is upstream CPython, built with `./configure && make` and installed under the cache
# folder. dpkg-source warns that it cannot check the .dsc's signature (the maintainer's key is in
# debian-keyring, not installed): apt has checked every file's digest against the signed index. What the build links against (OpenSSL for pip, zlib, libffi, ...) are
# bookworm's own -dev packages, installed with apt-get when missing.
#
# A finished build is marked by `<cache>/<version>/.built` and reused by every later run; a run
# that stopped halfway starts over. The build runs under `nice` so that it yields to whatever
# else the machine is doing.
set -euo pipefail

version=${1:?"usage: $0 VERSION CACHE_DIR (e.g. 3.13 ~/.cache/soma/cpython)"}
cache=${2:?"usage: $0 VERSION CACHE_DIR"}
suite=${DEBIAN_SOURCE_SUITE:-trixie}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
jobs=${JOBS:-$(nproc)}

root="$cache/$version"
prefix="$root/install"
python="$prefix/bin/python$version"
if [[ -f "$root/.built" && -x "$python" ]]; then
    echo "$python"
    exit 0
fi

log() { echo "cpython-from-debian: $*" >&2; }
elapsed() { echo "$(($(date +%s) - $1)) s"; }
started=$(date +%s)

# What `./configure` needs to build the modules the test suite and pip use (ssl, zlib, ctypes,
# sqlite3, bz2, lzma, uuid, readline, curses); `dpkg-dev` gives `dpkg-source`.
build_deps=(build-essential dpkg-dev pkg-config libssl-dev zlib1g-dev libffi-dev libsqlite3-dev
    libbz2-dev liblzma-dev uuid-dev libreadline-dev libncurses-dev libexpat1-dev)
missing=()
for pkg in "${build_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing bookworm's ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        log "not root: install them first (apt-get install ${missing[*]})"
        exit 1
    fi
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

rm -rf "$root"
apt_dir="$root/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$root/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
    >"$apt_dir/sources.list"
apt_private=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=$apt_dir/no-parts"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
)
log "reading $suite's source index"
apt-get "${apt_private[@]}" update -qq >&2
log "fetching the source package python$version"
(cd "$root/src" && apt-get "${apt_private[@]}" source --download-only -qq "python$version" >&2)
dsc=$(ls "$root/src"/python"$version"_*.dsc)
(cd "$root/src" && dpkg-source --skip-patches -x "$dsc" tree >&2)
log "fetched and unpacked in $(elapsed "$started")"

configured=$(date +%s)
cd "$root/src/tree"
# No --enable-optimizations: PGO would triple the build for a faster interpreter that a test
# run does not need. --with-ensurepip=install puts pip in place, which `python -m venv` copies.
nice -n 10 ./configure --prefix="$prefix" --with-ensurepip=install >"$root/configure.log" 2>&1 \
    || { tail -30 "$root/configure.log" >&2; exit 1; }
nice -n 10 make -j"$jobs" >"$root/make.log" 2>&1 || { tail -30 "$root/make.log" >&2; exit 1; }
log "built in $(elapsed "$configured")"
installed=$(date +%s)
nice -n 10 make altinstall >"$root/install.log" 2>&1 || { tail -30 "$root/install.log" >&2; exit 1; }
log "installed in $(elapsed "$installed")"

"$python" -c 'import ssl, zlib, ctypes, sqlite3, bz2, lzma' \
    || { log "the built interpreter lacks a module the tests or pip need"; exit 1; }
rm -rf "$root/src" "$apt_dir"
touch "$root/.built"
log "python$version ready in $(elapsed "$started"): $python"
echo "$python"
