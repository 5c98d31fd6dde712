#!/usr/bin/env bash
# Two torchrun "nodes" on this machine rendezvousing over 127.0.0.1 with the c10d backend: the
# same launch as a real multi-node job, where each node runs the second command with its own
# --node-rank and the endpoint is the first node's address.
#
#   scripts/two_nodes_local.sh [NPROC_PER_NODE] [hlat train overrides...]
#   scripts/two_nodes_local.sh 1 --train.steps 4 --train.run_dir runs/two-nodes
set -euo pipefail
nproc=${1:-1}
shift || true
port=${HLAT_RDZV_PORT:-29571}
launch() {
  python -m torch.distributed.run --nnodes 2 --node-rank "$1" --nproc-per-node "$nproc" \
    --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "hlat-local-$port" \
    -m hlat train "${@:2}"
}
# Both nodes print to this terminal: the c10d rendezvous gives global rank 0 (the one that logs)
# to whichever node arrives first, whatever its --node-rank.
launch 0 "$@" &
first=$!
launch 1 "$@" &
second=$!
status=0
wait "$first" || status=$?
wait "$second" || status=$?
exit "$status"
