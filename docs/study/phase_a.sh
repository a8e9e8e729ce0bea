#!/usr/bin/env bash
# Phase A: the main job's budget (train=quick: 60 steps x 2 rows <= 384 tokens, TTT 4, fp32 online),
# on ShareGPT answers vs the target's regenerated replies, random vs target_layer init.
source docs/study/common.sh
run() {  # run <name> [overrides]
  local name=$1; shift
  $PY train/run.py run_dir=outputs/study/$name stages=[prepare,train] wandb.mode=disabled head.init=random "$@" \
      > outputs/study/$name.train.log 2>&1
  evalhead outputs/study/$name/head outputs/study/$name/eval_heldout "eval.tasks=[$HELDOUT]" \
      eval.prompts_per_task=24 eval.max_new_tokens=64 eval.baselines=false > outputs/study/$name.eval.log 2>&1
  echo "$name done $(date +%T)"
}
run q_regen data.sources=[$REGEN] data.max_conversations=null
run q_regen_init data.sources=[$REGEN] data.max_conversations=null head.init=target_layer
run q_sharegpt data=sharegpt
