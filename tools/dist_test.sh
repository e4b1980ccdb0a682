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
source "$(dirname "$0")/launch.sh"  # mmsoft_dist_launch
mmsoft_dist_launch test 'CONFIG CHECKPOINT' "$@"
