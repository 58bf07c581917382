#!/bin/bash
# usage: nape.sh NAME METHOD [extra --set args...]; the mqmtar_inline study recipe (NAPE) plus overrides
POSITIONS=nape exec "$(dirname "$0")/trial.sh" "$@"
