#!/usr/bin/env bash
# Distributed testing with torchrun (torch.distributed.run) through mmengine.
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args]
#
# Without CUDA each process runs on CPU with the gloo backend (see
# mmsoft/tools_support/launch.py). PYTHON selects the interpreter (default: the project
# venv .venv when no environment is active, else python; see
# tools/python.sh). The data the config needs is checked once before the
# workers start.
set -e
if [[ $# -lt 3 ]]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [test.py args]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tools/python.sh"  # PYTHON: $PYTHON, else .venv, else python
echo "$(basename "$0"): python: $PYTHON" >&2
mmsoft_check_data test "$CONFIG" "${@:4}"  # data there? (once, not per rank)

PYTHONPATH="$ROOT":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes=$NNODES \
    --node_rank=$NODE_RANK \
    --master_addr=$MASTER_ADDR \
    --nproc_per_node=$GPUS \
    --master_port=$PORT \
    "$ROOT/tools/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "${@:4}"
