#!/usr/bin/env bash
# One idempotent script: fresh machine -> project-local virtualenv with the
# verified OpenMMLab stack and mmsoft installed in editable mode.
#
#   bash tools/setup_env.sh            # create/refresh .venv
#   MMSOFT_VENV=/path/to/venv bash tools/setup_env.sh
#
# A second run finishes in seconds: every step first checks whether its result
# is already there. The slow step is building mmcv 2.1.0 with its C++ ops from
# the PyPI sdist (20-30 min on 2 cores); the built wheel is kept in
# ${MMSOFT_CACHE:-~/.cache/mmsoft}/wheels so that a new venv reuses it.
#
# On a machine with an NVIDIA GPU (nvidia-smi present and torch sees CUDA)
# mmcv's ops are built with their CUDA kernels (FORCE_CUDA=1, for the GPU
# present unless TORCH_CUDA_ARCH_LIST is set; nvcc of torch's CUDA major
# version needed): RoIAlign, NMS etc. of the two-stage detectors run on the
# GPU. The CUDA wheel is cached in wheels/cuda. MMSOFT_MMCV_CUDA=0 / 1
# forces the CPU-only / CUDA build.
#
# torch comes from PyPI (its Linux wheel is built with CUDA 13.0: NVIDIA
# driver >= 580.65.06). MMSOFT_TORCH_CUDA=cu126 / cu128 (a CUDA 12 driver),
# cu130 or cpu installs that build of torch 2.14.1 from the PyTorch wheel
# index instead (and builds mmcv's CUDA ops against it; cached apart).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMSOFT_VENV:-$ROOT/.venv}"
[[ "$VENV" == /* ]] || VENV="$PWD/$VENV"  # relative: to where it was run
CACHE="${MMSOFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft}"
WHEELS="$CACHE/wheels"
export PIP_CONSTRAINT="$ROOT/requirements/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
MMCV_VERSION=2.1.0

# the PyTorch wheel index of a MMSOFT_TORCH_CUDA value (one line and exit 2
# for another value, before anything is done)
torch_index() {
    case "$1" in
        cu126|cu128|cu130|cpu) echo "https://download.pytorch.org/whl/$1" ;;
        *) echo "MMSOFT_TORCH_CUDA=$1 is not a torch build this script installs: use cu126 or cu128 (CUDA 12 driver), cu130, cpu, or leave it unset (PyPI's torch, CUDA 13.0)" >&2
           return 1 ;;
    esac
}
TORCH_CUDA="${MMSOFT_TORCH_CUDA:-}"
TORCH_INDEX=""
if [[ -n "$TORCH_CUDA" ]]; then
    TORCH_INDEX="$(torch_index "$TORCH_CUDA")" || exit 2
fi

START=$(date +%s)
STEP="start"
log() { printf '[setup_env %4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
fail() {
    local rc=$?
    printf '\n[setup_env] FAILED at step: %s (exit code %s)\n' "$STEP" "$rc" >&2
    case "$STEP" in
        python) echo "  fix: install Python 3.10-3.12 (python3.11 preferred) or set MMSOFT_PYTHON=/path/to/python" >&2 ;;
        venv) echo "  fix: install the venv module (apt-get install python3-venv) or remove a broken $VENV" >&2 ;;
        torch) echo "  fix: check network access to ${TORCH_INDEX:-PyPI}; torch==2.14.1/torchvision==0.29.1 need ~4 GB of disk" >&2 ;;
        mmcv-download) echo "  fix: check network access to PyPI (mmcv==$MMCV_VERSION sdist)" >&2 ;;
        mmcv-*) echo "  fix: see $CACHE/mmcv-build.log; a C++20 compiler (g++ >= 10) and python headers are needed" >&2 ;;
        *) echo "  fix: read the pip output above; rerunning the script resumes where it stopped" >&2 ;;
    esac
    exit "$rc"
}
trap fail ERR

# ---------------------------------------------------------------- python
STEP="python"
PY_BASE="${MMSOFT_PYTHON:-}"
if [[ -z "$PY_BASE" ]]; then
    for cand in python3.11 python3.10 python3.12 python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 12)' 2>/dev/null; then
            PY_BASE="$(command -v "$cand")"; break
        fi
    done
fi
[[ -n "$PY_BASE" ]] || { echo "no Python 3.10-3.12 found" >&2; false; }

# ---------------------------------------------------------------- venv
STEP="venv"
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtualenv $VENV with $PY_BASE"
    "$PY_BASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --progress-bar off)

# ---------------------------------------------------------------- fast path
# Metadata only (no torch import): every pinned package at its version,
# mmcv's compiled ops present, mmsoft installed in editable mode from ROOT.
up_to_date() {
    "$PY" - "$ROOT" <<'PYEOF'
import json, os, sys
from importlib.metadata import distribution, PackageNotFoundError
root = sys.argv[1]
pins = {'torch': '2.14.1', 'torchvision': '0.29.1', 'mmengine': '0.10.7',
        'mmcv': '2.1.0', 'mmdet': '3.3.0', 'mmsegmentation': '1.2.2',
        'mmpretrain': '1.2.0'}
try:
    for name, want in pins.items():
        if distribution(name).version.split('+')[0] != want:
            sys.exit(1)
    for name in ('ftfy', 'regex', 'pycocotools', 'pytest', 'ninja',
                 'matplotlib', 'scipy', 'onnx', 'onnxruntime', 'onnxscript'):
        distribution(name)
    # test / lint tools (requirements/tests.txt, requirements/lint.txt;
    # pytest-randomly and import-linter: their last releases for 3.10 there)
    new = sys.version_info >= (3, 11)
    for name, want in (('openmim', '0.3.9'), ('flake8', '7.1.1'),
                       ('isort', '5.13.2'), ('yapf', '0.43.0'),
                       ('pytest-randomly', '5.1.0' if new else '5.0.0'),
                       ('pytest-xdist', '3.8.0'),
                       ('import-linter', '2.16' if new else '2.15')):
        if distribution(name).version != want:
            sys.exit(1)
    # the editable install links configs/, tools/ and demo/ into mmsoft/.mim
    for name in ('configs', 'tools', 'demo'):
        if not os.path.isdir(os.path.join(root, 'mmsoft', '.mim', name)):
            sys.exit(1)
    if not distribution('numpy').version.startswith('1.'):
        sys.exit(1)
    files = distribution('mmcv').files or []
    if not any(str(f).startswith('mmcv/_ext') for f in files):
        sys.exit(1)
    url = json.loads(distribution('mmsoft').read_text('direct_url.json'))
    path = url['url'].replace('file://', '')
    if os.path.realpath(path) != os.path.realpath(root):
        sys.exit(1)
except (PackageNotFoundError, TypeError, KeyError, ValueError):
    sys.exit(1)
PYEOF
}
# Build mmcv's CUDA kernels? Only where a GPU driver is present (cheap
# test first, so that a CPU machine never imports torch here).
want_cuda_ops() {
    case "${MMSOFT_MMCV_CUDA:-auto}" in
        0) return 1 ;;
        1) return 0 ;;
    esac
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}
# mmcv's compiled ops include the CUDA kernels ('not available': CPU only),
# built for torch's CUDA major version (a switch of MMSOFT_TORCH_CUDA
# between CUDA 12 and 13 rebuilds them)
mmcv_has_cuda_ops() {
    "$PY" -c 'import sys, torch; from mmcv.ops import get_compiling_cuda_version as v; c = v(); sys.exit(0 if c != "not available" and c.split(".")[0] == str(torch.version.cuda).split(".")[0] else 1)' 2>/dev/null
}
cuda_ops_ok() {  # true unless CUDA ops are wanted and missing
    ! want_cuda_ops || mmcv_has_cuda_ops
}
# torch and torchvision are the build MMSOFT_TORCH_CUDA names (+cu126 ...);
# any build when it is unset
torch_build_ok() {
    [[ -z "${TORCH_CUDA:-}" ]] && return 0
    "$PY" - "$TORCH_CUDA" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    ok = all(version(n).partition('+')[2] == sys.argv[1]
             for n in ('torch', 'torchvision'))
except PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
PYEOF
}
# a GPU driver whose GPU torch cannot use (a driver older than torch's CUDA
# needs): one note, as mmcv's ops are then built for the CPU only
driver_hint() {
    [[ "${MMSOFT_MMCV_CUDA:-auto}" == auto ]] || return 0
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    local state drv need
    state="$("$PY" -c 'import torch; print(int(torch.cuda.is_available()), torch.version.cuda)' 2>/dev/null)" || return 0
    [[ "$state" == "0 "* && "$state" != "0 None" ]] || return 0
    drv="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
    case "${state#0 }" in
        13.*) need="CUDA 13.0 needs driver >= 580.65.06; on a CUDA 12 driver rerun with MMSOFT_TORCH_CUDA=cu126" ;;
        *) need="CUDA ${state#0 } needs a newer driver (NVIDIA's CUDA release notes, 'CUDA Driver')" ;;
    esac
    log "note: NVIDIA driver ${drv:-(version unknown)} found, but torch (CUDA ${state#0 }) sees no GPU, so mmcv's ops are CPU-only: $need (docs/en/get_started.md, 'On a GPU machine')"
}
if [[ "${1:-}" != "--force-check" ]] && up_to_date && torch_build_ok && cuda_ops_ok; then
    driver_hint
    log "environment up to date ($VENV); nothing to do"
    exit 0
fi

have() {  # have "pkg==ver" ... : true if all installed at exactly these versions
    "$PY" - "$@" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, _, want = spec.partition('==')
    try:
        got = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if want and got.split('+')[0] != want:
        sys.exit(1)
EOF
}

STEP="build-tools"
if ! "$PY" -c 'import setuptools, wheel, numpy, ninja; import pkg_resources; assert numpy.__version__ < "2"' 2>/dev/null; then
    log "installing build tools (setuptools<81, wheel, ninja, numpy<2)"
    "${PIP[@]}" -q --upgrade pip
    "${PIP[@]}" -q 'setuptools>=77.0.3,<81' wheel ninja 'numpy<2' packaging
fi

# ---------------------------------------------------------------- torch
STEP="torch"
if [[ -n "$TORCH_CUDA" ]] && { ! have torch==2.14.1 torchvision==0.29.1 || ! torch_build_ok; }; then
    log "installing torch 2.14.1+$TORCH_CUDA + torchvision 0.29.1+$TORCH_CUDA from $TORCH_INDEX (large download, a few minutes)"
    "${PIP[@]}" --extra-index-url "$TORCH_INDEX" "torch==2.14.1+$TORCH_CUDA" "torchvision==0.29.1+$TORCH_CUDA"
elif ! have torch==2.14.1 torchvision==0.29.1; then
    log "installing torch 2.14.1 + torchvision 0.29.1 (large download, a few minutes)"
    "${PIP[@]}" torch==2.14.1 torchvision==0.29.1
fi

STEP="mmengine"
if ! have mmengine==0.10.7; then
    log "installing mmengine 0.10.7"
    "${PIP[@]}" -q mmengine==0.10.7
fi

# ---------------------------------------------------------------- mmcv
MMCV_CUDA=0
MMCV_WHEELS="$WHEELS"
if want_cuda_ops; then
    MMCV_CUDA=1
    MMCV_WHEELS="$WHEELS/cuda${TORCH_CUDA:+-$TORCH_CUDA}"
else
    driver_hint
fi
if ! have mmcv==$MMCV_VERSION || ! "$PY" -c 'import mmcv.ops' 2>/dev/null \
        || { [[ $MMCV_CUDA == 1 ]] && ! mmcv_has_cuda_ops; }; then
    mkdir -p "$MMCV_WHEELS"
    WHL="$(ls "$MMCV_WHEELS"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)"
    if [[ -z "$WHL" ]]; then
        STEP="mmcv-download"
        BUILD="$CACHE/build"
        rm -rf "$BUILD"; mkdir -p "$BUILD"
        log "downloading the mmcv $MMCV_VERSION sdist"
        "$PY" -m pip download -q --no-deps --no-build-isolation --no-binary :all: -d "$BUILD" mmcv==$MMCV_VERSION
        tar -xzf "$BUILD"/mmcv-$MMCV_VERSION.tar.gz -C "$BUILD"
        SRC="$BUILD/mmcv-$MMCV_VERSION"
        STEP="mmcv-patch"
        # torch >= 2.10 headers need C++20
        sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
        grep -q -- '-std=c++20' "$SRC/setup.py"
        STEP="mmcv-build"
        NSRC=$(find "$SRC/mmcv/ops/csrc" -name '*.cpp' | grep -v -e '/cuda/' -e '/mlu/' -e '/npu/' -e '/mps/' -e '/musa/' -e '/parrots/' -e '/onnxruntime/' -e '/tensorrt/' | wc -l)
        if [[ $MMCV_CUDA == 1 ]]; then
            STEP="mmcv-cuda"
            command -v nvcc >/dev/null 2>&1 || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]] || {
                echo "a GPU is present but no nvcc: install the CUDA toolkit of torch's CUDA version, or MMSOFT_MMCV_CUDA=0 for CPU-only ops" >&2; false; }
            ARCHS="${TORCH_CUDA_ARCH_LIST:-$("$PY" -c 'import torch; print(";".join(sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))')}"
            export TORCH_CUDA_ARCH_LIST="$ARCHS"
            NSRC=$(( NSRC + $(find "$SRC/mmcv/ops/csrc" -path '*/cuda/*' -name '*.cu' | wc -l) ))
            log "building mmcv $MMCV_VERSION with C++ and CUDA ops (arch $ARCHS): ~$NSRC sources"
        else
            log "building mmcv $MMCV_VERSION with C++ ops (CPU): ~$NSRC sources, 20-30 min on 2 cores"
        fi
        STEP="mmcv-build"
        log "  full compiler output: $CACHE/mmcv-build.log"
        (
            cd "$SRC"
            MMCV_WITH_OPS=1 FORCE_CUDA=$MMCV_CUDA MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
                "$PY" -m pip wheel -v --no-deps --no-build-isolation -w "$BUILD/dist" . \
                >"$CACHE/mmcv-build.log" 2>&1
        ) &
        BPID=$!
        while kill -0 "$BPID" 2>/dev/null; do
            sleep 30
            NOBJ=$(find "$SRC/build" -name '*.o' 2>/dev/null | wc -l)
            log "  mmcv build: $NOBJ/$NSRC objects compiled"
        done
        wait "$BPID"
        WHL_BUILT="$(ls "$BUILD"/dist/mmcv-$MMCV_VERSION-*.whl | head -n1)"
        cp "$WHL_BUILT" "$MMCV_WHEELS/.tmp.whl" && mv "$MMCV_WHEELS/.tmp.whl" "$MMCV_WHEELS/$(basename "$WHL_BUILT")"
        WHL="$MMCV_WHEELS/$(basename "$WHL_BUILT")"
        rm -rf "$BUILD"
    else
        log "reusing the cached mmcv wheel $WHL"
    fi
    STEP="mmcv-install"
    if have mmcv==$MMCV_VERSION; then  # the same version, other ops
        "${PIP[@]}" -q --force-reinstall --no-deps "$WHL"
    else
        "${PIP[@]}" -q "$WHL"
    fi
    "$PY" -c 'import mmcv.ops'
    [[ $MMCV_CUDA == 0 ]] || mmcv_has_cuda_ops
fi

# ---------------------------------------------------------------- downstream
STEP="openmmlab"
if ! have mmdet==3.3.0 mmsegmentation==1.2.2 mmpretrain==1.2.0 ftfy regex pycocotools pytest; then
    log "installing mmdet 3.3.0, mmsegmentation 1.2.2, mmpretrain 1.2.0 and test tools"
    "${PIP[@]}" -q mmdet==3.3.0 mmsegmentation==1.2.2 mmpretrain==1.2.0 \
        ftfy regex pycocotools -r "$ROOT/requirements/tests.txt"
fi

STEP="deploy"
if ! have onnx onnxruntime onnxscript; then
    log "installing onnx, onnxruntime, onnxscript (tools/deployment)"
    "${PIP[@]}" -q -r "$ROOT/requirements/deploy.txt"
fi

STEP="test-tools"
if "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    TEST_TOOLS=(pytest-randomly==5.1.0 import-linter==2.16)
else  # their last releases for Python 3.10 (requirements/tests.txt)
    TEST_TOOLS=(pytest-randomly==5.0.0 import-linter==2.15)
fi
TEST_TOOLS+=(pytest-xdist==3.8.0)
if ! have openmim==0.3.9 flake8==7.1.1 isort==5.13.2 yapf==0.43.0 "${TEST_TOOLS[@]}"; then
    log "installing test and lint tools (openmim, pytest-randomly, pytest-xdist, import-linter, flake8, isort, yapf)"
    "${PIP[@]}" -q -r "$ROOT/requirements/tests.txt" -r "$ROOT/requirements/lint.txt"
fi

STEP="mmsoft"
# run from / so that the checkout itself is not on sys.path
# (again when mmsoft/.mim, the links to configs/, tools/ and demo/, is missing)
if ! (cd / && "$PY" -c 'import mmsoft, sys, os; sys.exit(0 if os.path.realpath(os.path.dirname(os.path.dirname(mmsoft.__file__))) == os.path.realpath(sys.argv[1]) else 1)' "$ROOT" 2>/dev/null) \
        || [[ ! -d "$ROOT/mmsoft/.mim/configs" || ! -d "$ROOT/mmsoft/.mim/tools" || \
              ! -d "$ROOT/mmsoft/.mim/demo" ]]; then
    log "installing mmsoft (editable)"
    "${PIP[@]}" -q --no-build-isolation --no-deps -e "$ROOT"
fi

STEP="check"
cd /
"$PY" -c 'import mmsoft, mmdet, mmseg, mmpretrain, mmcv.ops; print("stack ok: torch", __import__("torch").__version__, "| mmcv", mmcv.__version__ if (mmcv:=__import__("mmcv")) else "", "| mmdet", mmdet.__version__, "| mmseg", mmseg.__version__, "| mmpretrain", mmpretrain.__version__)'
log "done: activate with 'source $VENV/bin/activate'"
