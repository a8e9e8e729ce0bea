#!/usr/bin/env bash
# The block drafter (head=dflash) beside EAGLE-3 at one budget (issue 19): the main job's data and
# rows (train=quick: 2 rows <= 384 tokens per step, lr 1e-3, fp32 online), STEPS optimizer steps,
# both from a random start; then AL per task (held-out chat + the eval sets, T=0) and time per token
# against plain decoding. EAGLE-3 verifies chains of 4 (TTT 4); the block drafter 4 and its whole block (7).
source docs/study/common.sh
STEPS=${STEPS:-150}
train() {  # train <name> [overrides]
  local name=$1; shift
  $PY train/run.py run_dir=outputs/study/$name stages=[prepare,train] wandb.mode=disabled head.init=random \
      train.max_steps=$STEPS train.warmup_steps=10 train.val_every=50 train.checkpoint_every=50 "$@" \
      > outputs/study/$name.train.log 2>&1
  echo "$name trained $(date +%T)"
}
train bq_eagle3 head=eagle3 head.confidence=false
train bq_dflash head=dflash
evalhead outputs/study/bq_eagle3/head outputs/study/bq_eagle3/eval eval.prompts_per_task=6 \
    > outputs/study/bq_eagle3.eval.log 2>&1
echo "bq_eagle3 evaluated $(date +%T)"
evalhead outputs/study/bq_dflash/head outputs/study/bq_dflash/eval eval.prompts_per_task=6 "eval.compare=[static:7]" \
    > outputs/study/bq_dflash.eval.log 2>&1
echo "bq_dflash evaluated $(date +%T)"
