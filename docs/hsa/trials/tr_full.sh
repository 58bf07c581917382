#!/bin/bash
# usage: tr.sh NAME [extra train args...]  -- full [B] layout trial via the CLI, one thread
name=$1; shift
D=/work/main/runs/hsa_full/trials/$name
rm -rf $D
export OMP_NUM_THREADS=1
echo "== $name: longsparse train --task passkey --arch hsa --preset cpu --out $D --set model.n_lower=2 --set model.encoder_layers=1 --set model.landmark=encoder_cls --set model.hsa_local=true $*"
/usr/bin/time -f "wall %e s" longsparse train --task passkey --arch hsa --preset cpu --out $D \
  --set model.n_lower=2 --set model.encoder_layers=1 --set model.landmark=encoder_cls --set model.hsa_local=true "$@"
