#!/usr/bin/env bash
# Held-out teacher-forced acceptance of a trained head, measured as docs/study/ablations.sh
# measures its runs (the same 29 held-out conversations of the shipped replies, the same batches):
# one optimizer step at lr 0 from the head, then the validation pass (<run>/val_metrics.jsonl).
#   CORE=1 bash docs/study/teacher_forced.sh outputs/study/peer_imported peer
source docs/study/common.sh
HEAD=${1:?head directory}; NAME=${2:?name}
CORE=${CORE:-0}
run=outputs/study/tf_$NAME
OMP_NUM_THREADS=1 taskset -c "$CORE" $PY train/run.py run_dir=$run stages=[prepare,train] \
  "${REPLIES_1024[@]}" "${STUDY_TRAIN[@]}" train.hidden_states=online train.max_steps=1 train.lr=0 \
  train.warmup_steps=0 train.val_every=1 train.checkpoint_every=1 head.init="$HEAD" > "$run.log" 2>&1
echo "$NAME: $(tail -1 "$run/val_metrics.jsonl")"
