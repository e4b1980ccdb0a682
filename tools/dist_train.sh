#!/usr/bin/env bash
# Distributed training with torchrun (torch.distributed.run) through mmengine.
#
#   tools/dist_train.sh CONFIG GPUS [train.py args]
#   tools/dist_train.sh configs/retinanet_soft_small_1x.py 8
#
# GPUS processes are started on this node (NNODES/NODE_RANK/MASTER_ADDR/PORT
# for several nodes). Without CUDA each process runs on CPU with the gloo
# backend (see tools/mmsoft_tools/launch.py), e.g. `tools/dist_train.sh CONFIG 2`.
# PYTHON selects the interpreter (default: the project venv .venv when no
# environment is active, else python; see tools/python.sh). train.py's
# pre-flight (its arguments and --cfg-options, the config, the checkpoint
# files, the data, the ImageNet file) runs once before the workers start,
# and PORT must be free.
source "$(dirname "$0")/launch.sh"  # mmsoft_dist_launch
mmsoft_dist_launch train CONFIG "$@"
