#!/bin/bash
# usage: seq_trial.sh NAME TASK METHOD [extra --set args...]  (cpu preset + overrides, one thread)
export OMP_NUM_THREADS=1
cd "$(dirname "$0")/../../.."   # the repository root
mkdir -p runs/rope_trials runs/seq_trials
name=$1; task=$2; method=$3; shift 3
/usr/bin/time -f "train wall %e s" longsparse train --task $task --method $method --preset cpu \
  --out runs/seq_trials/$name "$@" > runs/seq_trials/$name.log 2>&1
