#!/usr/bin/env bash
# make compat: the support matrix (noxfile.py), then its table
# (docs/en/compat/matrix.md, matrix.csv).
#
#   bash tools/compat/run.sh                 # every stack
#   bash tools/compat/run.sh -s torch2.1     # one stack (nox arguments)
#
# nox lives in a small venv of its own under the cache; the stacks'
# venvs, mmcv wheels and results too (${MMSOFT_CACHE:-~/.cache/mmsoft}/
# compat): a re-run with nothing changed takes seconds. The first run
# downloads three torch versions (several GB) and builds mmcv twice
# (20-40 min each on 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${MMSOFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmsoft}"
NOX_VENV="$CACHE/compat/nox-venv"
PY_BASE="${MMSOFT_PYTHON:-$(command -v python3.11 || command -v python3)}"
if ! "$NOX_VENV/bin/python" -c 'import nox' 2>/dev/null; then
    mkdir -p "$CACHE/compat"
    "$PY_BASE" -m venv "$NOX_VENV"
    "$NOX_VENV/bin/python" -m pip install -q --disable-pip-version-check nox
fi
rc=0
"$NOX_VENV/bin/python" -m nox -f "$ROOT/noxfile.py" "$@" || rc=$?
"$NOX_VENV/bin/python" "$ROOT/tools/compat/matrix.py" || rc=$?
exit $rc
