# The interpreter that runs the tools, and this checkout's mmsoft for them.
#
# Run it to start any tool from a checkout, installed or not:
#   bash tools/python.sh tools/analysis/benchmark.py --threads 2
# runs the script with $PYTHON (below) and the checkout first on PYTHONPATH,
# as the launch scripts do. (The tools import the mmsoft Python finds: with
# `make demo` / `pip install -e .` plain `python tools/...` is the same.)
#
# Sourced by tools/launch.sh (the body of tools/dist_train.sh, dist_test.sh,
# slurm_train.sh and slurm_test.sh) once it has set ROOT (the repository
# root).
#
# Sets PYTHON, the interpreter that runs the tools:
#   1. $PYTHON when given (PYTHON=/path/to/python tools/dist_train.sh ...);
#   2. else, when no virtualenv and no conda environment other than `base`
#      is active, the project venv ${MMSOFT_VENV:-$ROOT/.venv} made by
#      `make demo` / tools/setup_env.sh, if it exists;
#   3. else `python` (`python3` when there is no `python`).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run, not sourced
    ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fi
if [[ -z "${PYTHON:-}" ]]; then
    _mmsoft_venv="${MMSOFT_VENV:-$ROOT/.venv}"
    if [[ -z "${VIRTUAL_ENV:-}" && ( -z "${CONDA_DEFAULT_ENV:-}" ||
          "${CONDA_DEFAULT_ENV:-}" == base ) &&
          -x "$_mmsoft_venv/bin/python" ]]; then
        PYTHON="$_mmsoft_venv/bin/python"
    elif command -v python >/dev/null 2>&1; then
        PYTHON=python
    else
        PYTHON=python3
    fi
    unset _mmsoft_venv
fi

# mmsoft_check_data MODE CONFIG [tool args]: before any worker starts, check
# once that $PYTHON can run the tools and that the data the config needs
# (MODE test: test data, tools/mmsoft_tools/data_check.py) is on disk; MODE
# train: tools/train.py's whole pre-flight (its arguments, --cfg-options,
# the config, checkpoint files, data, the ImageNet file) with
# MMSOFT_PREFLIGHT=1; else print one short message and return 1.
# MMSOFT_SKIP_DATA_CHECK=1 skips the data check.
mmsoft_check_data() {
    MMSOFT_TRAIN_PY="$ROOT/tools/train.py" \
        PYTHONPATH="$ROOT:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" - "$@" <<'PY'
import os
import sys
import warnings
# mmengine 0.10's import of pkg_resources: not the user's business here
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
try:
    import torch  # noqa: F401
    import mmengine  # noqa: F401
except ImportError as e:
    sys.exit(f'{sys.executable} cannot run the tools ({e}): run `make demo`'
             ' (creates .venv), activate your environment, or set '
             'PYTHON=/path/to/python')
mode, rest = sys.argv[1], sys.argv[2:]
if mode == 'train':  # tools/train.py's own pre-flight (MMSOFT_PREFLIGHT)
    if '-h' in rest or '--help' in rest:
        sys.exit(0)  # the ranks print it
    import runpy
    os.environ['MMSOFT_PREFLIGHT'] = '1'
    train = os.environ.pop('MMSOFT_TRAIN_PY')  # beside this script
    sys.argv = [train, rest[0], '--launcher', 'none'] + rest[1:]
    runpy.run_path(train, run_name='__main__')  # exits
if os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', '0'):
    sys.exit(0)
from mmsoft_tools.data_check import main
sys.exit(main(sys.argv[1:]))
PY
}

# run as a command: bash tools/python.sh SCRIPT [args]
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    if [[ $# -lt 1 ]]; then
        echo "usage: bash $0 SCRIPT [args] (e.g. tools/analysis/get_flops.py)" >&2
        exit 2
    fi
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" "$@"
fi
