# The body of tools/dist_train.sh, dist_test.sh, slurm_train.sh and
# slurm_test.sh, which source this file and call one function below (their
# usage and arguments are theirs: see each script's head).
#
# Sets ROOT (the repository root) and, through tools/python.sh, PYTHON.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/tools/python.sh"  # PYTHON: $PYTHON, else .venv, else python

# mmsoft_usage NEED USAGE ARG...: exit 2 with "usage: SCRIPT USAGE" when
# there are fewer than NEED ARGs.
mmsoft_usage() {
    local need=$1 usage=$2
    shift 2
    if [[ $# -lt $need ]]; then
        echo "usage: $0 $usage" >&2
        exit 2
    fi
}

# mmsoft_dist_launch TOOL 'NAME...' ARG...: the tool's positional arguments
# (as many as NAMEs: CONFIG [CHECKPOINT]), then GPUS, then its options;
# checks the data once, then starts GPUS processes of tools/TOOL.py (train
# or test) on this node with torchrun (NNODES/NODE_RANK/MASTER_ADDR/PORT for
# several nodes) and --launcher pytorch.
mmsoft_dist_launch() {
    local tool=$1 names=($2)
    shift 2
    local n=${#names[@]}
    mmsoft_usage $((n + 1)) "${names[*]} GPUS [$tool.py args]" "$@"
    local positional=("${@:1:n}") gpus=${@:n+1:1} options=("${@:n+2}")
    if ! [[ $gpus =~ ^[1-9][0-9]*$ ]]; then  # e.g. forgotten: an option
        echo "error: $(basename "$0"): GPUS must be the number of processes (a positive integer), got '$gpus'; usage: $0 ${names[*]} GPUS [$tool.py args]" >&2
        exit 2
    fi
    echo "$(basename "$0"): python: $PYTHON" >&2
    # the tool's pre-flight, once, not per rank (train.py's own checks,
    # the data of test.py); the master port free?
    mmsoft_check_data "$tool" "$1" "${options[@]}" || exit
    mmsoft_check_port "${PORT:-29500}" || exit
    PYTHONPATH="$ROOT":$PYTHONPATH \
    "$PYTHON" -m torch.distributed.run \
        --nnodes=${NNODES:-1} \
        --node_rank=${NODE_RANK:-0} \
        --master_addr=${MASTER_ADDR:-"127.0.0.1"} \
        --nproc_per_node=$gpus \
        --master_port=${PORT:-29500} \
        "$ROOT/tools/$tool.py" \
        "${positional[@]}" \
        --launcher pytorch "${options[@]}"
}

# mmsoft_check_port PORT: on the master node (NODE_RANK 0), return 1 with one
# line when a program listens on PORT here (torchrun's store would fail to
# listen there, with a traceback per process), naming a free port.
mmsoft_check_port() {
    local port=$1 free
    [[ ${NODE_RANK:-0} == 0 && $port =~ ^[0-9]+$ ]] || return 0
    _mmsoft_listening "$port" || return 0
    for ((free = port + 1; free < port + 100; free++)); do
        _mmsoft_listening "$free" || break
    done
    echo "error: $(basename "$0"): PORT=$port is in use on this machine (another distributed job?); set PORT to a free one, e.g. PORT=$free $0 ..." >&2
    return 1
}

# _mmsoft_listening PORT: whether a program accepts connections on PORT of
# this machine
_mmsoft_listening() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# mmsoft_slurm_launch TOOL LAST PARTITION JOB_NAME CONFIG LAST_VALUE ARG...:
# one srun task of tools/TOOL.py per GPU (GPUS, GPUS_PER_NODE,
# CPUS_PER_TASK, SRUN_ARGS) with --launcher slurm; LAST names the fourth
# argument: WORK_DIR (given to train.py as --work-dir) or CHECKPOINT.
mmsoft_slurm_launch() {
    local tool=$1 last=$2
    shift 2
    mmsoft_usage 4 "PARTITION JOB_NAME CONFIG $last [$tool.py args]" "$@"
    local partition=$1 job_name=$2 config=$3 value=$4
    if [[ $last == WORK_DIR ]]; then
        value="--work-dir=$value"
    fi
    local gpus=${GPUS:-8} gpus_per_node=${GPUS_PER_NODE:-8}
    set -x
    PYTHONPATH="$ROOT":$PYTHONPATH \
    srun -p ${partition} \
        --job-name=${job_name} \
        --gres=gpu:${gpus_per_node} \
        --ntasks=${gpus} \
        --ntasks-per-node=${gpus_per_node} \
        --cpus-per-task=${CPUS_PER_TASK:-5} \
        --kill-on-bad-exit=1 \
        ${SRUN_ARGS:-} \
        "$PYTHON" -u "$ROOT/tools/$tool.py" "$config" "$value" \
        --launcher="slurm" "${@:5}"
}
