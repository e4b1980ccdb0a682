#!/usr/bin/env bash
# Training on a Slurm cluster (one task per GPU, --launcher slurm).
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
# PYTHON selects the interpreter (default: the project venv .venv when no
# environment is active, else python; see tools/python.sh).
if [[ $# -lt 4 ]]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tools/python.sh"  # PYTHON: $PYTHON, else .venv, else python

set -x
PYTHONPATH="$ROOT":$PYTHONPATH \
srun -p ${PARTITION} \
    --job-name=${JOB_NAME} \
    --gres=gpu:${GPUS_PER_NODE} \
    --ntasks=${GPUS} \
    --ntasks-per-node=${GPUS_PER_NODE} \
    --cpus-per-task=${CPUS_PER_TASK} \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
    --launcher="slurm" "${@:5}"
