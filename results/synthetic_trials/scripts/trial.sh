#!/bin/bash
# usage: trial.sh NAME METHOD [extra --set args...]; the mqmtar_inline study recipe plus overrides,
# under RoPE (POSITIONS=nape for NAPE: nape.sh)
export OMP_NUM_THREADS=1
cd "$(dirname "$0")/../../.."   # the repository root
mkdir -p runs/rope_trials runs/seq_trials
name=$1; method=$2; shift 2
/usr/bin/time -f "train wall %e s" longsparse train --task mqmtar_inline --method $method --positions ${POSITIONS:-rope} --preset cpu \
  --out runs/rope_trials/$name --set model.d_model=64 --set model.d_ff=128 --set train.steps=2500 --set train.lr=2e-3 \
  --set train.warmup_steps=100 --set train.batch_size=64 --set "train.val_lengths=[48, 64]" --set train.val_samples=64 \
  --set train.val_every=250 --set train.ckpt_every=250 --set train.log_every=100 "$@" > runs/rope_trials/$name.log 2>&1
