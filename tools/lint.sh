#!/usr/bin/env bash
# Lint as OpenMMLab codebases do: flake8, isort --check-only, yapf --diff
# (settings: setup.cfg; pinned versions: requirements/lint.txt, installed by
# tools/setup_env.sh), then the import contracts of mmsoft and the tools'
# package (import-linter, setup.cfg [importlinter]; requirements/tests.txt;
# about a second). Exits non-zero if any tool reports something.
#
#   tools/lint.sh                 # the whole tree
#   tools/lint.sh mmsoft/compat.py  # given files / folders
#   FIX=1 tools/lint.sh           # apply isort + yapf in place instead
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if [[ -x "${MMSOFT_VENV:-$ROOT/.venv}/bin/python" ]]; then
        PY="${MMSOFT_VENV:-$ROOT/.venv}/bin/python"
    else
        PY=python3
    fi
fi
if ! "$PY" -c 'import flake8, isort, yapf' 2>/dev/null; then
    echo "lint: flake8 / isort / yapf missing for $PY; run: bash tools/setup_env.sh" \
         "(or $PY -m pip install -r requirements/lint.txt)" >&2
    exit 2
fi
if [[ $# -gt 0 ]]; then
    TARGETS=("$@")
else
    TARGETS=(mmsoft tools tests configs demo projects setup.py)
fi
EXCL=(--exclude 'mmsoft/.mim/**')
rc=0
if [[ "${FIX:-0}" == "1" ]]; then
    "$PY" -m isort "${TARGETS[@]}" || rc=1
    "$PY" -m yapf -i -r "${EXCL[@]}" "${TARGETS[@]}" || rc=1
    exit $rc
fi
echo "== flake8"
"$PY" -m flake8 "${TARGETS[@]}" || rc=1
echo "== isort --check-only --diff"
"$PY" -m isort --check-only --diff "${TARGETS[@]}" || rc=1
echo "== yapf --diff"
"$PY" -m yapf --diff -r "${EXCL[@]}" "${TARGETS[@]}" || rc=1
echo "== import-linter (setup.cfg [importlinter])"
"$PY" -c 'import importlinter' 2>/dev/null || {
    echo "lint: import-linter missing for $PY; run: bash tools/setup_env.sh" \
         "(or $PY -m pip install -r requirements/tests.txt)" >&2
    exit 2; }
PYTHONPATH="$ROOT:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))' \
    || rc=1
if [[ $rc -eq 0 ]]; then echo "lint: clean"; else echo "lint: FAILED" >&2; fi
exit $rc
