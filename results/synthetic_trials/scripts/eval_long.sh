#!/bin/bash
# usage: results/synthetic_trials/scripts/eval_long.sh STUDY LENGTH SAMPLES CHECKPOINT RUN_NAME...
# Evaluates runs of a study (runs/reproduce/STUDY/RUN_NAME) at one length beyond the study's own lengths, one
# process, one thread, and copies each evaluation JSON here as STUDY__RUN_NAME__LENGTH__CHECKPOINT.json.
# The study's report does not read these files (its lengths stop at 64x); tabulate them with
#   longsparse report docs/results/long/*.json --out docs/results/long/report
set -euo pipefail
cd "$(dirname "$0")/../../.."   # the repository root
export OMP_NUM_THREADS=1
study=$1; length=$2; samples=$3; ck=$4; shift 4
for name in "$@"; do
  run=runs/reproduce/$study/$name
  dest=docs/results/long/${study}__${name}__${length}__${ck}.json
  if [ -e "$dest" ]; then echo "$dest exists; skipped"; continue; fi
  log=$run/eval_long_${length}_${ck}.log
  longsparse eval "$run" --lengths "$length" --samples "$samples" --checkpoint "$ck" > "$log" 2>&1
  cp "$(sed -n 's/^results: //p' "$log")" "$dest"     # the file this evaluation wrote (its last line names it)
  tail -n 2 "$log" | head -1
done
