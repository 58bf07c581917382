#!/bin/bash
# Session 25's second GPU call (it ran as gpu26_verify.sh writing runs/gpu26v, renamed after like gpu25.sh; its
# output is in gpu25_call2/), after the device fixes that the first call made necessary: the CUDA checks again,
# the init question at the paper's width for what time is left (ASEntmax, NAPE, 4 layers x d 512, reference vs
# scale-aware init, seed 0, lr 1e-3), and a short training + long-length evaluation of the other methods on CUDA.
# usage (repository root, on the GPU machine): bash results/synthetic_trials/scripts/gpu25_verify.sh OUTDIR [TRAIN_SECONDS]
set -u
OUT=${1:?usage: gpu25_verify.sh OUTDIR [TRAIN_SECONDS]}
T=${2:-210}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
LS="python3 -m longsparse.cli"
DEV=${DEVICE:-cuda}   # DEVICE=cpu: a dry test of this script on a machine without a GPU
R=runs/gpu25v
mkdir -p "$R" "$OUT"
common=(--task mqmtar_inline --preset cpu --set train.device=$DEV --set "train.val_lengths=[64]"
        --set train.val_samples=128 --set train.val_every=100 --set train.ckpt_every=100 --set train.log_every=25
        --set train.threads=2)
train() {   # NAME, then train arguments
  local name=$1; shift
  timeout -s TERM "$T" $LS train "${common[@]}" --out "$R/$name" "$@" > "$R/$name.log" 2>&1
  echo "$name: exit $? after $SECONDS s" >> "$R/exits.txt"
}
pids=()
init=(--method asentmax --positions nape --set model.n_layers=4 --set model.d_model=512 --set model.n_heads=16
      --set model.head_dim=32 --set model.d_ff=1024 --set train.lr=1e-3 --set train.warmup_steps=200
      --set train.batch_size=64 --set train.steps=3000 --seed 0)
train init_reference_s0 "${init[@]}" --set model.asentmax_init=reference &
pids+=($!)
train init_scaleaware_s0 "${init[@]}" --set model.asentmax_init=scale_aware &
pids+=($!)
for m in ssmax adatemp entmax; do   # the mqmtar_inline study's model, 300 steps: does each method run on CUDA
  train smoke_$m --method $m --positions nape --set model.d_model=64 --set model.d_ff=128 --set train.lr=2e-3 \
    --set train.steps=300 &
  pids+=($!)
done

if ls .whl/*.whl > /dev/null 2>&1; then   # adasplash (and entmax) wheels, carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    > "$OUT/cuda_check.log" 2>&1
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site
LONGSPARSE_KERNEL=0 timeout 150 python3 results/synthetic_trials/scripts/cuda_check.py "$OUT/cuda_check.json" \
  >> "$OUT/cuda_check.log" 2>&1
timeout 100 python3 -m pytest -q -rs -p no:cacheprovider tests/test_attention_cuda.py tests/test_device_placement.py \
  >> "$OUT/cuda_check.log" 2>&1
wait "${pids[@]}"

for run in "$R"/smoke_*/; do
  timeout 40 $LS eval "$run" --lengths 64,1024,4096 --samples 100 --checkpoint last --device $DEV \
    > "${run%/}.eval.log" 2>&1 &
done
for run in "$R"/init_*/; do
  timeout 40 $LS eval "$run" --lengths 64,128,256,512 --samples 200 --checkpoint last --device $DEV \
    > "${run%/}.eval.log" 2>&1 &
done
wait
tar czf "$OUT/gpu25v_runs.tar.gz" --exclude='*.pt' "$R"
echo "done after $SECONDS s"
