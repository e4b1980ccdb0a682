#!/usr/bin/env bash
# Training on a Slurm cluster (one task per GPU, --launcher slurm).
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
# PYTHON selects the interpreter (default: the project venv .venv when no
# environment is active, else python; see tools/python.sh).
source "$(dirname "$0")/launch.sh"  # mmsoft_slurm_launch
mmsoft_slurm_launch train WORK_DIR "$@"
