#!/usr/bin/env bash
# One check of a single-GPU machine in at most 9 minutes, offline (benchmarks/gpu_check.py says
# what it measures). hlat runs from this source tree with the torch already installed.
#
#   benchmarks/gpu_check.sh [OUT_DIR]                # on the GPU machine; OUT_DIR else $OUT else ./gpu_check_out
#   benchmarks/gpu_check.sh --cpu-dry-run [OUT_DIR]  # every stage on the CPU at toy sizes (a rehearsal, not data)
#   benchmarks/gpu_check.sh --help
set -euo pipefail
cd "${0%/*}/.."  # no dirname: the script needs nothing but bash and Python
PY=${PYTHON:-$(command -v python3 || command -v python || true)}  # images often have only python3
[[ -n "$PY" ]] || { echo "gpu_check.sh: neither python3 nor python is on PATH; set PYTHON" >&2; exit 2; }
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "$PY" benchmarks/gpu_check.py "$@"
