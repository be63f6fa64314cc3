#!/usr/bin/env bash
# A torch built from source as a checked world: Debian's python3-torch (PyTorch compiled by Debian
# from its source package, with the distribution's compiler, Python and BLAS) in a Debian trixie
# root made with debootstrap, with this tool installed there from this checkout (its dependencies
# are Debian's packages too). In that root: lint (both halves), build (an empty kernel cache, timed),
# verify --both, verify --check requires-grad --both, and `run` on a fused-optimizer program,
# unpatched and patched. The outputs land in build/source-build/; scripts/compat_matrix.py
# --source-build renders them into build/ (REPORT=1: reports/source-build-torch<release>-debian.md
# and .json, and the row of the compatibility matrix).
#
#   make source-build [REPORT=1]                # as root (debootstrap, apt-get and chroot need it)
#   scripts/check_source_build.sh --dry-run     # print the steps; run and change nothing
#
# The root (about 2 GB, debootstrap about 30 s and apt-get about 2 minutes with a near mirror) is kept
# in .cache/source-build/root (gitignored) and reused; SOURCE_BUILD_ROOT=DIR puts it elsewhere,
# SOURCE_BUILD_MIRROR=URL picks the Debian mirror. `make clean` does not remove it: rm -rf it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
R=${SOURCE_BUILD_ROOT:-$ROOT/.cache/source-build/root}
MIRROR=${SOURCE_BUILD_MIRROR:-http://deb.debian.org/debian}
OUT=$ROOT/build/source-build
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
PACKAGES="python3-torch libtorch-dev g++ ninja-build python3-yaml python3-jinja2 python3-typing-extensions
python3-setuptools python3-pip python3-venv ca-certificates"
DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
STAMP=$R/.torchgen-patch-root-complete

say() { echo "source-build: $*" >&2; }
step() {  # print the step; run it unless --dry-run
    say "\$ $*"
    [ "$DRY" = 1 ] || "$@"
}
# every command inside the root: a PID namespace of its own with its own /proc (gone when it exits:
# nothing stays mounted under the root), a clean environment but pip's settings of this machine
inside() {
    local pip_env
    pip_env=$(env | grep -E '^PIP_[A-Z_]+=[^ ]*$' | grep -v '^PIP_CERT=' || true)  # PIP_CERT: the copied bundle
    # shellcheck disable=SC2086
    unshare --pid --fork --mount-proc="$R/proc" chroot "$R" /usr/bin/env -i \
        PATH=/opt/tgp/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
        PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt $pip_env "$@"
}

if [ "$DRY" = 0 ] && [ "$(id -u)" != 0 ]; then
    echo "error: the source-build check needs root (debootstrap, apt-get and chroot)" >&2
    exit 3
fi
if [ ! -f "$STAMP" ]; then
    command -v debootstrap >/dev/null || step apt-get install -y -q debootstrap
    if [ ! -x "$R/usr/bin/apt-get" ]; then
        step mkdir -p "$(dirname "$R")"
        step debootstrap --variant=minbase trixie "$R" "$MIRROR"
    fi
    step cp /etc/resolv.conf "$R/etc/resolv.conf"
    # shellcheck disable=SC2086
    step inside sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends $(echo $PACKAGES)"
    step touch "$STAMP"
fi

# pip inside the root trusts what this machine's pip trusts: its CA bundle and its configuration
# files (paths that exist only here, such as local wheel folders, are ignored there)
bundle=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
[ -f "$bundle" ] && step cp "$bundle" "$R/etc/ssl/certs/host-ca-bundle.crt"
[ -f /etc/pip.conf ] && step cp /etc/pip.conf "$R/etc/pip.conf"
[ -d /etc/xdg/pip ] && step mkdir -p "$R/etc/xdg" && step cp -r /etc/xdg/pip "$R/etc/xdg/"
[ -d "$HOME/.config/pip" ] && step mkdir -p "$R/root/.config" && step cp -r "$HOME/.config/pip" "$R/root/.config/"

# the tool, as this checkout has it (tracked and untracked files that git does not ignore)
SRC=$R/opt/torchgen-patch-src
step rm -rf "$SRC" "$R/opt/tgp" "$R/out"
step mkdir -p "$SRC" "$R/out"
say "\$ git ls-files ... | tar -x -C $SRC"
if [ "$DRY" = 0 ]; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -x -C "$SRC"
    git -C "$ROOT" describe --always --dirty > "$R/out/commit.txt"
fi
step inside python3 -m venv --system-site-packages /opt/tgp
step inside /opt/tgp/bin/pip install -q --no-deps --no-build-isolation /opt/torchgen-patch-src
step cp "$ROOT/scripts/source_build_checks.sh" "$R/out/checks.sh"
step inside bash /out/checks.sh
step rm -rf "$OUT"
step mkdir -p "$(dirname "$OUT")"
step cp -r "$R/out" "$OUT"
report=()
[ "${REPORT:-}" = 1 ] && report=(--report)
step "$PYTHON" "$ROOT/scripts/compat_matrix.py" --source-build "$OUT" "${report[@]}"
