#!/usr/bin/env bash
# Testing on a Slurm cluster (one task per GPU, --launcher slurm).
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#   tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args]
# PYTHON selects the interpreter (default: the project venv .venv when no
# environment is active, else python; see tools/python.sh).
# a local CHECKPOINT that is not a file: tools/test.py's one line, once
# (not once per rank after the workers start)
if [[ $# -ge 4 && "$4" != *://* && ! -f "$4" ]]; then
    echo "error: checkpoint '$4' not found: give the path of a trained model (work_dirs/<config>/epoch_N.pth or iter_N.pth); mmsoft releases no trained weights (the authors' ImageNet classifiers, converted: docs/en/user_guides/official_weights.md)" >&2
    exit 1
fi
source "$(dirname "$0")/launch.sh"  # mmsoft_slurm_launch
mmsoft_slurm_launch test CHECKPOINT "$@"
