#!/bin/bash
# run trials sequentially with trial.py: each arg is "name|json"
for spec in "$@"; do
  name="${spec%%|*}"; js="${spec#*|}"
  echo "== $name $js" > "$name.log"
  python trial.py "$js" >> "$name.log" 2>&1
done
