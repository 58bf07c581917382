#!/bin/bash
# Sequential study queue (one process at a time, one thread). usage: study.sh SPECFILE
# SPECFILE lines (re-read before each item, so lines can be appended while it runs):
#   NAME|EVAL|extra longsparse-train args (after --preset cpu_full)
#   EVAL: none (train only) | short (256..16384 x100) | long (short + 65536 x$N65, 262144 x$N262)
export OMP_NUM_THREADS=1
cd /work/main
R=/work/main/runs/hsa_full
i=1
while :; do
  line=$(sed -n "${i}p" "$1"); i=$((i+1))
  [ -z "$line" ] && { echo "[$(date +%T)] queue empty"; break; }
  [ -f "$R/STOP" ] && { echo "STOP file: not starting: $line"; break; }
  if [ "${line:0:1}" = "!" ]; then echo "[$(date +%T)] run: ${line:1}"; bash -c "${line:1}" < /dev/null; continue; fi
  IFS='|' read -r name ev args <<< "$line"
  if [ ! -f "$R/$name.train.done" ]; then
    echo "[$(date +%T)] train $name: longsparse train --task passkey --arch hsa --preset cpu_full --out runs/hsa_full/$name $args"
    /usr/bin/time -f "train wall %e s" longsparse train --task passkey --arch hsa --preset cpu_full \
        --out runs/hsa_full/$name $args < /dev/null > $R/$name.train.log 2>&1 && touch $R/$name.train.done
    tail -4 $R/$name.train.log
  fi
  if [ "$ev" != none ] && [ ! -f "$R/$name.eval1.done" ]; then
    echo "[$(date +%T)] eval $name 256..16384 x100"
    longsparse eval runs/hsa_full/$name --lengths 256,1024,4096,16384 --samples 100 --checkpoint last \
        < /dev/null > $R/$name.eval1.log 2>&1 && touch $R/$name.eval1.done
    grep -E "L=|needles" $R/$name.eval1.log
  fi
  if [ "$ev" = long ] && [ ! -f "$R/$name.eval2.done" ]; then
    [ -f "$R/STOP" ] && { echo "STOP file: no long eval for $name"; break; }
    n65=$(cat $R/N65 2>/dev/null || echo 16); n262=$(cat $R/N262 2>/dev/null || echo 8)
    echo "[$(date +%T)] eval $name 65536 x$n65, 262144 x$n262"
    longsparse eval runs/hsa_full/$name --lengths 65536 --samples $n65 --checkpoint last < /dev/null > $R/$name.eval2.log 2>&1 && \
    longsparse eval runs/hsa_full/$name --lengths 262144 --samples $n262 --checkpoint last < /dev/null >> $R/$name.eval2.log 2>&1 && \
        touch $R/$name.eval2.done
    grep -E "L=|needles" $R/$name.eval2.log
  fi
  echo "[$(date +%T)] done $name"
done
