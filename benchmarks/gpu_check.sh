#!/usr/bin/env bash
# One check of a single-GPU machine (H100/H200), offline, in under 5 minutes: tokens/s, MFU and
# peak memory of `1b` at a reduced global batch (eager, compiled, compiled + `op` recompute,
# bf16-sr, float8), a 4-layer slice of `hlat-7b` at its real width and sequence length, the
# attention kernel actually run, start-up time, a checkpoint save and resume, `hlat generate` and
# `hlat eval` on a task file written here. Results go to $OUT (else ./gpu_check_out) as they come:
# gpu_check.md, logs/<section>.log, metrics/<run>.jsonl.
#
#   benchmarks/gpu_check.sh                # on the GPU machine, from the source tree
#   benchmarks/gpu_check.sh --cpu-dry-run  # every section on the CPU at toy sizes (a rehearsal, not data)
#
# hlat runs from this source tree (PYTHONPATH=src) with the torch already installed, or from an
# install made with `pip install --no-deps`. Each section runs under `timeout`; a section that would
# end after the total budget (GPU_CHECK_BUDGET_S, default 290 s; 1800 s and 4x each section's
# limit in the dry run) is skipped and says so. Run directories live in /dev/shm when it has room (checkpoints of 1b are ~18 GB).
set -u -o pipefail
(( BASH_VERSINFO[0] >= 5 )) || { echo "gpu_check.sh needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; }
DRY=0
[[ "${1:-}" == "--cpu-dry-run" ]] && DRY=1
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT/logs" "$OUT/metrics"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
REPORT=$OUT/gpu_check.md
ROWS=$OUT/metrics/rows.jsonl
rm -f "$ROWS"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
HELPER="python benchmarks/gpu_check_report.py"

if (( DRY )); then
  BUDGET=${GPU_CHECK_BUDGET_S:-1800}; DEVICE=cpu; MIXED=fp32
  LIMIT_SCALE=4  # a CPU compiles blocks far slower than the GPU machine's host
  # Toy shapes: the same code paths, seconds per run on a CPU.
  SHRINK=(--model.n_layers 2 --model.d_model 128 --model.n_heads 4 --model.n_kv_heads 2 --model.ffn_dim 352
          --model.vocab_size 4096 --model.max_seq_len 128 --data.seq_len 128)
  ONE_B=(--train.steps 3 --train.global_batch 4 --train.micro_batch 2)
  SEVEN_B=(--train.steps 3 --train.global_batch 2 --train.micro_batch 1)
else
  BUDGET=${GPU_CHECK_BUDGET_S:-290}; DEVICE=cuda; MIXED=mixed
  LIMIT_SCALE=1
  SHRINK=()
  ONE_B=(--train.steps 6 --train.global_batch 8 --train.micro_batch 4)
  SEVEN_B=(--train.steps 5 --train.global_batch 4 --train.micro_batch 1)
fi
shm_free_gb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print int($4 / 1048576)}')
if (( ${shm_free_gb:-0} >= 48 )); then WORK=/dev/shm/hlat_gpu_check_$$; else WORK=$OUT/work; fi
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
COMMON=(--train.device "$DEVICE" --train.log_every 1 --eval.every 0 --train.sample_prompt "" --train.plot false
        --train.tensorboard false --checkpoint.every 1000 --checkpoint.keep_last 1)

note() { echo "$*" | tee -a "$REPORT"; }

# run_section NAME LIMIT_S CMD...: CMD under timeout, each output line stamped with seconds since the
# section began (start-up and checkpoint times are read from the stamps); returns CMD's status.
# Sets SECTION_WALL. Skips (status 125) when less than 15 s of the budget would be left.
run_section() {
  local name=$1 limit=$(( $2 * LIMIT_SCALE )); shift 2
  local left=$(( BUDGET - SECONDS ))
  (( limit > left )) && limit=$left
  if (( limit < 15 )); then note "- $name: skipped, ${left} s of the ${BUDGET} s budget left"; return 125; fi
  local log=$OUT/logs/$name.log start=${EPOCHREALTIME/./} tenths
  timeout -k 5 "$limit" "$@" 2>&1 | while IFS= read -r line; do
    tenths=$(( (${EPOCHREALTIME/./} - start) / 100000 ))
    printf '%5d.%d | %s\n' $(( tenths / 10 )) $(( tenths % 10 )) "$line"
  done > "$log"
  local rc=${PIPESTATUS[0]}
  tenths=$(( (${EPOCHREALTIME/./} - start) / 100000 ))
  SECTION_WALL=$(( tenths / 10 )).$(( tenths % 10 ))
  (( rc == 124 )) && note "- $name: timed out after ${limit} s (log: logs/$name.log)"
  (( rc != 0 && rc != 124 )) && note "- $name: failed with status $rc; last lines of logs/$name.log:" \
    && tail -n 5 "$log" | sed 's/^/      /' | tee -a "$REPORT"
  return "$rc"
}

# train LABEL LIMIT_S [--keep] ARGS...: one `hlat train` run, its result line in the report.
train() {
  local label=$1 limit=$2 keep=0; shift 2
  [[ "${1:-}" == "--keep" ]] && keep=1 && shift
  local dir=$WORK/$label
  if run_section "$label" "$limit" python -m hlat train --fresh "${COMMON[@]}" --train.run_dir "$dir" "$@" "${SHRINK[@]}"; then
    cp "$dir/metrics.jsonl" "$OUT/metrics/$label.jsonl"
    note "$($HELPER run "$label" "$dir" "$SECTION_WALL" "$ROWS" "$OUT/logs/$label.log")"
  fi
  (( keep )) || rm -rf "$dir"
}

# accepts ARGS...: whether this hlat's configuration accepts the overrides (an option may not exist yet).
accepts() { python -m hlat config --preset 1b "$@" > /dev/null 2>&1; }

{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')$( (( DRY )) && echo ' -- CPU DRY RUN: toy shapes, not GPU data')"
  echo
  echo "Command: \`benchmarks/gpu_check.sh $*\`, budget ${BUDGET} s, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Training runs: medians over the steps after the first; start-up = time to the first step's start."
  echo
  echo "## Machine"
} > "$REPORT"
run_section env 60 $HELPER env && cut -c11- "$OUT/logs/env.log" | grep "^- " | tee -a "$REPORT"

note ""; note "## Attention kernels (one forward of a 1-block model, profiled)"
run_section attention 90 $HELPER attention "$DEVICE" --precision.mode "$MIXED" "${SHRINK[@]}" \
  && cut -c11- "$OUT/logs/attention.log" | grep '^- ' | tee -a "$REPORT"

note ""; note "## Training runs"
train 1b_eager 90 --keep --preset 1b "${ONE_B[@]}" --precision.mode "$MIXED" --parallel.compile false
train 1b_compiled 120 --preset 1b "${ONE_B[@]}" --precision.mode "$MIXED" --parallel.compile true

note ""; note "## Checkpoint save and resume (the eager 1b run, 2 more steps)"
grep -h 'checkpoint: ' "$OUT/logs/1b_eager.log" 2>/dev/null | sed 's/^ *\([0-9.]*\) | /- save (at \1 s): /' | tee -a "$REPORT"
steps=$(grep -o '"step": [0-9]*' "$OUT/metrics/1b_eager.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
if [[ -n "$steps" ]] && run_section resume 90 python -m hlat train "${COMMON[@]}" --train.run_dir "$WORK/1b_eager" \
     --preset 1b "${ONE_B[@]}" --train.steps $(( steps + 2 )) --precision.mode "$MIXED" --parallel.compile false "${SHRINK[@]}"; then
  grep -h 'resuming from\|checkpoint: \|^ *[0-9.]* | step ' "$OUT/logs/resume.log" | sed 's/^ *\([0-9.]*\) | /- at \1 s: /' | tee -a "$REPORT"
fi

note ""; note "## hlat generate and hlat eval (the resumed checkpoint, untrained weights)"
if [[ -d "$WORK/1b_eager/checkpoints" ]]; then
  run_section generate 60 python -m hlat generate --checkpoint "$WORK/1b_eager" --prompt "def main(" --max-new-tokens 32 \
      --device "$DEVICE" --precision "$MIXED" && tail -n 2 "$OUT/logs/generate.log" | cut -c11- | sed 's/^/    /' | tee -a "$REPORT"
  task=$WORK/task && mkdir -p "$task"
  for i in 0 1 2 3; do
    echo "{\"question\": \"Question $i: which word is a colour?\", \"choices\": [\"red\", \"run\", \"rain\"], \"answer\": 0}"
  done > "$task/test.jsonl"
  cat > "$task/gpu_check.yaml" <<EOF
task: gpu_check_colours
dataset_path: json
dataset_kwargs:
  data_files:
    test: $task/test.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: choices
doc_to_target: answer
EOF
  run_section eval 60 python -m hlat eval --checkpoint "$WORK/1b_eager" --latest --task-file "$task/gpu_check.yaml" \
      --device "$DEVICE" --precision "$MIXED" --output "$OUT/eval" && cut -c11- "$OUT/logs/eval.log" | grep '^|\|^results' | sed 's/^/    /' | tee -a "$REPORT"
else
  note "- skipped: the eager 1b run left no checkpoint"
fi
rm -rf "$WORK/1b_eager"

note ""; note "## More training runs (in order of priority; the budget may end them)"
seven=(--preset hlat-7b --model.n_layers 4 --parallel.tp 1 --parallel.dp_sharding ddp)
train 7b_4layers_compiled 120 "${seven[@]}" "${SEVEN_B[@]}" --parallel.compile true
train 1b_bf16-sr_compiled 120 --preset 1b "${ONE_B[@]}" --precision.mode bf16-sr --parallel.compile true
if ! python -c "import torchao.float8" > /dev/null 2>&1; then
  note "- 1b_float8_compiled: skipped, torchao is not importable here (pip install --no-deps torchao, or the float8 extra)"
elif accepts --precision.float8 true; then
  train 1b_float8_compiled 120 --preset 1b "${ONE_B[@]}" --precision.mode "$MIXED" --precision.float8 true --parallel.compile true
else
  note "- 1b_float8_compiled: skipped, this hlat has no precision.float8"
fi
if accepts --parallel.activation_checkpoint op; then
  train 1b_op_recompute_compiled 120 --preset 1b "${ONE_B[@]}" --precision.mode "$MIXED" --parallel.activation_checkpoint op --parallel.compile true
else
  note "- 1b_op_recompute_compiled: skipped, this hlat refuses --parallel.activation_checkpoint op"
fi

note ""; note "## Summary"
$HELPER table "$ROWS" | tee -a "$REPORT"
note ""; note "Total: ${SECONDS} s of the ${BUDGET} s budget."
