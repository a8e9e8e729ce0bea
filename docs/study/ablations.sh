#!/usr/bin/env bash
# Recipe ablations at one budget (issue 13, item 3): the shipped replies (rows <= 1024 tokens, 5%
# held out), offline hidden states built once and shared, fp32, 4 rows per step, STEPS optimizer
# steps (warm-up 10, cosine to 0), EAGLE-3 with a 16k draft vocab, no confidence head. Each run
# changes one setting of `base` (TTT 4, lr 1e-3, random start); the figure is the held-out
# teacher-forced acceptance at the last step (<run>/val_metrics.jsonl). Runs that change the
# training rows (epochs*: the same steps over fewer rows, the held-out rows unchanged) build their
# own cache; raw (other rows altogether) reads its target online. Run one per core:
#   CORE=0 bash docs/study/ablations.sh base lr3e-3 ttt3 ...
source docs/study/common.sh
STEPS=${STEPS:-50}
CORE=${CORE:-0}        # the core (taskset list) each run is pinned to
THREADS=${THREADS:-1}  # its torch threads
declare -A CHANGE=(
  [base]=""
  [lr3e-3]="train.lr=3e-3"
  [lr3e-4]="train.lr=3e-4"
  [constant]="train.lr_schedule=constant"  # no decay after the warm-up
  [linear]="train.lr_schedule=linear"
  [ttt3]="train.ttt_steps=3"
  [ttt7]="train.ttt_steps=7"
  [init_target]="head.init=target_layer"
  [vocab8k]="head.draft_vocab_size=8192"
  [vocab32k]="head.draft_vocab_size=32768"
  [epochs2]="data.max_train_rows=100"  # base sees 200 rows once; this 100 rows twice
  [epochs4]="data.max_train_rows=50"
  # ShareGPT's own answers to the same first 576 conversations instead of the target's replies;
  # its validation rows are ShareGPT's too: measure it on the replies with teacher_forced.sh.
  [raw]="data.sources=[sharegpt] data.max_conversations=576 train.hidden_states=online"  # online: 200 rows, not 520
)
for name in "$@"; do
  run=outputs/study/abl_$name
  mkdir -p "$run"
  if [[ $name != base && $name != epochs* && $name != raw && ! -e $run/hidden_cache ]]; then ln -s ../abl_base/hidden_cache "$run/hidden_cache"; fi
  OMP_NUM_THREADS=$THREADS taskset -c "$CORE" $PY train/run.py run_dir=$run stages=[prepare,train] \
    "${REPLIES_1024[@]}" "${STUDY_TRAIN[@]}" train.hidden_states=offline train.max_steps=$STEPS train.lr=1e-3 \
    train.warmup_steps=10 train.val_every=25 train.checkpoint_every=25 train.log_every=10 head.init=random \
    ${CHANGE[$name]} > "$run.train.log" 2>&1
  echo "$name trained $(date +%T): $(tail -1 "$run/val_metrics.jsonl")"
done
