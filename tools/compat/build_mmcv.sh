#!/usr/bin/env bash
# Build (once) the mmcv wheel with its C++ ops for the torch of one
# interpreter and print the cached wheel's path.
#
#   bash tools/compat/build_mmcv.sh /path/to/venv/bin/python [MMCV_VERSION]
#
# The mmcv wheel links against torch's C++ ABI, so it is cached per torch
# version: ${MMSOFT_CACHE:-~/.cache/mmsoft}/wheels/torch-<version>/ (the
# verified stack of tools/setup_env.sh keeps its wheel in wheels/ itself).
# The build is nice'd (MMSOFT_NICE, default 15): it takes 20-40 min on 2
# cores. Needs setuptools>=77.0.3,<81, wheel, ninja and numpy in the venv
# (the sdist is built with --no-build-isolation against the venv's torch).
set -euo pipefail

PY="$1"
MMCV_VERSION="${2:-2.1.0}"
CACHE="${MMSOFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft}"
TORCH="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
WHEELS="$CACHE/wheels/torch-$TORCH"
mkdir -p "$WHEELS"
# one build per torch version at a time: a second caller waits for it
exec 9>"$WHEELS/.lock"
flock 9
WHL="$(ls "$WHEELS"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [[ -n "$WHL" ]]; then
    echo "$WHL"
    exit 0
fi
BUILD="$(mktemp -d "$CACHE/build-torch-$TORCH.XXXX")"
trap 'rm -rf "$BUILD"' EXIT
LOG="$WHEELS/mmcv-build.log"
echo "[build_mmcv] building mmcv $MMCV_VERSION with its C++ ops for torch $TORCH (20-40 min); log: $LOG" >&2
"$PY" -m pip download -q --no-deps --no-build-isolation --no-binary :all: -d "$BUILD" "mmcv==$MMCV_VERSION" >&2
tar -xzf "$BUILD/mmcv-$MMCV_VERSION.tar.gz" -C "$BUILD"
SRC="$BUILD/mmcv-$MMCV_VERSION"
# torch >= 2.10 headers need C++20; older torch builds with mmcv's C++17
if "$PY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 10) else 1)'; then
    sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
    grep -q -- '-std=c++20' "$SRC/setup.py"
fi
(
    cd "$SRC"
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        nice -n "${MMSOFT_NICE:-15}" "$PY" -m pip wheel -v --no-deps --no-build-isolation -w "$BUILD/dist" . \
        >"$LOG" 2>&1
) || { echo "[build_mmcv] mmcv build failed for torch $TORCH: see $LOG" >&2; exit 1; }
BUILT="$(ls "$BUILD"/dist/mmcv-"$MMCV_VERSION"-*.whl | head -n1)"
cp "$BUILT" "$WHEELS/.tmp.whl" && mv "$WHEELS/.tmp.whl" "$WHEELS/$(basename "$BUILT")"
echo "$WHEELS/$(basename "$BUILT")"
