#!/usr/bin/env bash
# Rehearse the offline GPU install of docs/parallelism.md on any machine: the documented run-time
# packages are fetched as wheels, installed into a fresh venv with --no-index (pip reaches no
# network), hlat itself with --no-deps, and the tiny preset trains a few steps.
#
#   scripts/offline_install_check.sh [TORCH]   TORCH defaults to torch==2.13.0 (the CPU build here);
#                                              on a GPU image, skip the download and keep its torch
set -euo pipefail
cd "$(dirname "$0")/.."
torch_spec="${1:-torch==2.13.0}"
# the one list, as the docs state it (tests/project/test_offline_install.py checks it against the imports)
packages=$(grep '^Run-time imports of the training path' docs/parallelism.md | cut -d: -f2- | grep -o '`[a-z_]*`' | tr -d '`' | tr '\n' ' ')
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
py="$scratch/venv/bin/python"
echo "offline install: fetching $torch_spec $packages as wheels"
"$py" -m pip download -q -d "$scratch/wheels" -c requirements/test.lock "$torch_spec" $packages
"$py" -m pip install -q --no-index --find-links "$scratch/wheels" "$torch_spec" $packages
"$py" -m pip install -q --no-index --no-deps --no-build-isolation -e .
echo "offline install: training the tiny preset (4 steps) with only: $("$py" -m pip list --format freeze 2>/dev/null | tr '\n' ' ')"
HOME="$scratch/home" "$scratch/venv/bin/hlat" train --train.steps 4 --eval.every 0 --parallel.compile false \
  --train.run_dir "$scratch/run"
echo "offline install: ok"
