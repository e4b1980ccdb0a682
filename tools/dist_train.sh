#!/usr/bin/env bash
# Distributed training with torchrun (torch.distributed.run) through mmengine.
#
#   tools/dist_train.sh CONFIG GPUS [train.py args]
#   tools/dist_train.sh configs/retinanet_soft_small_1x.py 8
#
# GPUS processes are started on this node (NNODES/NODE_RANK/MASTER_ADDR/PORT
# for several nodes). Without CUDA each process runs on CPU with the gloo
# backend (see mmsoft/tools_support/launch.py), e.g. `tools/dist_train.sh CONFIG 2`.
# PYTHON selects the interpreter (default: the project venv .venv when no
# environment is active, else python; see tools/python.sh). The data the
# config needs is checked once before the workers start.
set -e
if [[ $# -lt 2 ]]; then
    echo "usage: $0 CONFIG GPUS [train.py args]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tools/python.sh"  # PYTHON: $PYTHON, else .venv, else python
echo "$(basename "$0"): python: $PYTHON" >&2
mmsoft_check_data train "$CONFIG" "${@:3}"  # data there? (once, not per rank)

PYTHONPATH="$ROOT":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes=$NNODES \
    --node_rank=$NODE_RANK \
    --master_addr=$MASTER_ADDR \
    --nproc_per_node=$GPUS \
    --master_port=$PORT \
    "$ROOT/tools/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
