#!/bin/bash
# Session 25's first GPU call (docs/results.md sections 1 and 4; it ran as gpu26.sh writing runs/gpu26 — the
# session was miscounted and the files renamed after; its output is in gpu25_call1/): eight trainings at once on one GPU,
# each stopped after TRAIN_SECONDS (its metrics.jsonl and last checkpoint keep what it reached), then a short
# evaluation of each, plus the CUDA checks of ls.attention and the real adasplash tests.
#   init question at the paper's width (4 layers, d 512, 16 heads x 32, FFN 1024; NAPE; ASEntmax):
#     reference vs scale-aware init, seeds 0 and 1, lr 5e-4, 200 warm-up steps, batch 64
#   RoPE on mqmtar_inline (softmax) with GPU-sized budgets: r11-r14 below
# usage (repository root, on the GPU machine): bash results/synthetic_trials/scripts/gpu25.sh OUTDIR [TRAIN_SECONDS]
# needs: python3 with torch (CUDA); adasplash/entmax wheels in .whl for the adasplash tests (optional)
set -u
OUT=${1:?usage: gpu25.sh OUTDIR [TRAIN_SECONDS]}
T=${2:-420}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
LS="python3 -m longsparse.cli"
DEV=${DEVICE:-cuda}   # DEVICE=cpu: a dry test of this script on a machine without a GPU
R=runs/gpu25
mkdir -p "$R" "$OUT"
{ date; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } \
  > "$OUT/env.txt" 2>&1

common=(--task mqmtar_inline --preset cpu --set train.device=$DEV --set "train.val_lengths=[64]"
        --set train.val_samples=128 --set train.val_every=250 --set train.ckpt_every=250 --set train.log_every=50
        --set train.threads=2)
d512=(--set model.n_layers=4 --set model.d_model=512 --set model.n_heads=16 --set model.head_dim=32
      --set model.d_ff=1024)
train() {   # NAME, then train arguments
  local name=$1; shift
  timeout -s TERM "$T" $LS train "${common[@]}" --out "$R/$name" "$@" > "$R/$name.log" 2>&1
  echo "$name: exit $? after $SECONDS s" >> "$R/exits.txt"
}
pids=()
init=(--method asentmax --positions nape "${d512[@]}" --set train.lr=5e-4 --set train.warmup_steps=200
      --set train.batch_size=64 --set train.steps=6000)
train init_reference_s0 "${init[@]}" --seed 0 --set model.asentmax_init=reference &
pids+=($!)
train init_scaleaware_s0 "${init[@]}" --seed 0 --set model.asentmax_init=scale_aware &
pids+=($!)
train init_reference_s1 "${init[@]}" --seed 1 --set model.asentmax_init=reference &
pids+=($!)
train init_scaleaware_s1 "${init[@]}" --seed 1 --set model.asentmax_init=scale_aware &
pids+=($!)
rope=(--method softmax --positions rope)
# r11: the NAPE headline recipe (3 layers, d 64, lr 4e-3) with 4x the batch and 30,000 steps
train r11_d64_3l_b256 "${rope[@]}" --set model.n_layers=3 --set model.d_model=64 --set model.d_ff=128 \
  --set train.lr=4e-3 --set train.warmup_steps=100 --set train.batch_size=256 --set train.steps=30000 &
pids+=($!)
# r12: d 128 (4 heads x 32), 3 layers
train r12_d128_3l_b256 "${rope[@]}" --set model.n_layers=3 --set model.d_model=128 --set model.head_dim=32 \
  --set model.d_ff=256 --set train.lr=2e-3 --set train.warmup_steps=200 --set train.batch_size=256 \
  --set train.steps=30000 &
pids+=($!)
# r13: d 256 (8 heads x 32), 4 layers
train r13_d256_4l_b128 "${rope[@]}" --set model.n_layers=4 --set model.d_model=256 --set model.n_heads=8 \
  --set model.head_dim=32 --set model.d_ff=512 --set train.lr=1e-3 --set train.warmup_steps=500 \
  --set train.batch_size=128 --set train.steps=20000 &
pids+=($!)
# r14: the paper's MQMTAR model (4 layers, d 512, 16 heads x 32)
train r14_d512_4l_b128 "${rope[@]}" "${d512[@]}" --set train.lr=5e-4 --set train.warmup_steps=500 \
  --set train.batch_size=128 --set train.steps=20000 &
pids+=($!)

# while they train: ls.attention on CUDA against the CPU float64 reference, and the real adasplash tests
# (with adasplash installed, the auto path of entmax / sparsemax without ALiBi goes through its kernels)
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    > "$OUT/cuda_check.log" 2>&1
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site
LONGSPARSE_KERNEL=0 python3 results/synthetic_trials/scripts/cuda_check.py "$OUT/cuda_check.json" >> "$OUT/cuda_check.log" 2>&1
python3 -m pytest -q -rs -p no:cacheprovider tests/test_attention_cuda.py >> "$OUT/cuda_check.log" 2>&1
# a partial copy every minute in case the call is cut off (it starts only after the checks above, which took
# 408 s in the first call, so there it never got to write one)
( while sleep 60; do tar czf "$OUT/progress.tar.gz" --exclude='*.pt' "$R" 2> /dev/null; done ) &
ticker=$!
wait "${pids[@]}"
kill $ticker 2> /dev/null

# evaluation of each last checkpoint (60 s at most each, all at once)
for run in "$R"/init_*/; do
  timeout 60 $LS eval "$run" --lengths 64,128,256,512 --samples 200 --checkpoint last --device $DEV \
    > "${run%/}.eval.log" 2>&1 &
done
for run in "$R"/r1?_*/; do
  timeout 60 $LS eval "$run" --lengths 64,128,256 --samples 200 --checkpoint last --device $DEV \
    > "${run%/}.eval.log" 2>&1 &
done
for run in "$R"/r1?_*/; do   # one JSON per run: a run without a checkpoint does not stop the others
  timeout 60 python3 results/synthetic_trials/value_token_acc.py "${run%/}.value_token_acc.json" "${run%/}:last" \
    > "${run%/}.value_token_acc.log" 2>&1 &
done
wait
tar czf "$OUT/gpu25_runs.tar.gz" --exclude='*.pt' "$R"
rm -f "$OUT/progress.tar.gz"
echo "done after $SECONDS s"
