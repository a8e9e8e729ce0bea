#!/usr/bin/env bash
# Phase B: the learning curve. One run over the regenerated replies (rows <= 1024 tokens, 5% held
# out), offline hidden states, bf16 autocast, TTT 4, 4 rows per step, lr 1e-3 cosine; held-out
# teacher-forced acceptance every 25 steps (val_metrics.jsonl), a head snapshot every 50.
source docs/study/common.sh
STEPS=${STEPS:?set STEPS}
INIT=${INIT:-random}
$PY train/run.py run_dir=outputs/study/lc stages=[prepare,train] wandb.mode=disabled \
  data.sources=[$REGEN] data.max_conversations=null data.max_length=1024 data.val_fraction=0.05 \
  train=recipe train.hidden_states=offline train.precision=bf16 train.ttt_steps=4 train.batch_size=4 \
  train.grad_accum=1 train.max_steps=$STEPS train.lr=1e-3 train.warmup_steps=20 train.val_every=25 \
  train.val_batches=8 train.checkpoint_every=25 train.snapshot_every=50 train.log_every=10 \
  head.init=$INIT > outputs/study/lc.train.log 2>&1
echo "lc trained $(date +%T)"
