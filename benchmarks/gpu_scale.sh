#!/bin/bash
# The GPU-scale study as one time-limited job (docs/gpu.md): `longsparse reproduce` on a study file (default
# src/longsparse_experiments/configs/reproduce/gpu_scale.toml) with a time budget, one worker process per cell on
# the one GPU, records and resume bundles written to OUTDIR (benchmarks/gpu_scale.py, a thin wrapper).
#
#   [STUDY=FILE] bash benchmarks/gpu_scale.sh OUTDIR [SECONDS] [RESUME_DIR]
#
# STUDY: the study file (a path from the repository root or absolute); run folders go to runs/<its name>.
# OUTDIR: a new or empty folder. SECONDS: the job's wall clock (default 420; give the job a limit a little above
# it). RESUME_DIR: the OUTDIR of an earlier job: its bundles and store are restored, so trainings resume (or are
# skipped when finished) and cut-short evaluations continue where they stopped.
# DEVICE=cpu: the dry run on a machine without a GPU (tiny model, 6 steps, lengths 64-1,024, one worker;
# run folders in runs/<study name>_cpu_dry, or $GPU_SCALE_RUNS); default SECONDS 110 there.
# JOBS=K: K worker processes (default: one per cell on the GPU, one in the dry run).
# MAX_EXAMPLES=K: evaluate at most K examples per length in this job (the rest in the next).
set -u
OUT=${1:?usage: gpu_scale.sh OUTDIR [SECONDS] [RESUME_DIR]}
DEV=${DEVICE:-cuda}
if [ "$DEV" = cpu ]; then
  SECS=${2:-110}; THREADS=1
  # the dry run tests the script, not the fused CPU entmax kernel: no 30-60 s kernel build on a fresh machine
  export LONGSPARSE_KERNEL=${LONGSPARSE_KERNEL:-0}
else
  SECS=${2:-420}; THREADS=2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-$THREADS}
exec python3 "$ROOT/benchmarks/gpu_scale.py" run --out "$OUT" --seconds "$SECS" --device "$DEV" \
  ${JOBS:+--workers "$JOBS"} ${3:+--resume "$3"} ${STUDY:+--study "$STUDY"} ${MAX_EXAMPLES:+--max-examples "$MAX_EXAMPLES"}
