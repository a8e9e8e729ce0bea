#!/usr/bin/env bash
# Phase C. final: the last head on held-out chat + the three eval sets, with the baselines and
# prompt lookup in our decoder (ngram:4) on the same turns. snapshots: AL on held-out chat only.
source docs/study/common.sh
if [ "$1" = final ]; then
  evalhead outputs/study/lc/head outputs/study/lc/eval_final eval.prompts_per_task=6 eval.max_new_tokens=64 \
      "eval.compare=[ngram:4]" > outputs/study/lc.eval_final.log 2>&1
  echo "final evaluated $(date +%T)"
else
  for snap in "$@"; do
    evalhead outputs/study/lc/snapshots/$snap outputs/study/lc/eval_$snap "eval.tasks=[$HELDOUT]" \
        eval.prompts_per_task=24 eval.max_new_tokens=64 eval.baselines=false > outputs/study/lc.eval_$snap.log 2>&1
    echo "$snap evaluated $(date +%T)"
  done
fi
