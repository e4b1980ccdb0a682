#!/usr/bin/env bash
# Distributed testing with torchrun (torch.distributed.run) through mmengine.
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args]
#
# Without CUDA each process runs on CPU with the gloo backend (see
# tools/mmsoft_tools/launch.py). PYTHON selects the interpreter (default: the project
# venv .venv when no environment is active, else python; see
# tools/python.sh). The data the config needs is checked once before the
# workers start.
# a local CHECKPOINT that is not a file: tools/test.py's one line, once
# (not once per rank after the workers start)
if [[ $# -ge 2 && "$2" != *://* && ! -f "$2" ]]; then
    echo "error: checkpoint '$2' not found: give the path of a trained model (work_dirs/<config>/epoch_N.pth or iter_N.pth); mmsoft releases no trained weights (the authors' ImageNet classifiers, converted: docs/en/user_guides/official_weights.md)" >&2
    exit 1
fi
source "$(dirname "$0")/launch.sh"  # mmsoft_dist_launch
mmsoft_dist_launch test 'CONFIG CHECKPOINT' "$@"
