#!/usr/bin/env bash
# Fine-tune the shipped head on one more replies asset, or a comma-separated mix of assets (one pass,
# session 30's recipe), then judge
# its bf16 copy beside the shipped head: AL on all 48 held-out chat prompts (the verdict, fixed in
# advance; never the eval sets), both heads at the same time (candidate on core 0, shipped on
# core 1), compared prompt by prompt. The eval sets' AL and speed come after, from eval/bench.py.
# Target and training in bf16 where the CPU computes it natively (avx512_bf16 or AMX: the figures of
# sessions 30-36), else in fp32 (auto: forced bf16 took ~110 s a step there against 6.5 s with
# avx512_bf16, session 37). Resumable.
#   bash docs/study/finetune_judge.sh smollm2_replies_later2 outputs/s32
#   STEPS=640 bash docs/study/finetune_judge.sh smollm2_replies_sampled,smollm2_replies_short3 outputs/s37
source docs/study/common.sh
ASSET=${1:?usage: finetune_judge.sh <replies asset> <out dir>}
OUT=${2:?usage: finetune_judge.sh <replies asset> <out dir>}
mkdir -p "$OUT"
VAL=0.03
ROWS=8
LR=${LR:-5e-4}           # session 30's recipe: peak 5e-4 after 10 warm-up steps
WARMUP=${WARMUP:-10}
# One pass (unless STEPS is set): the assets' kept conversations, less the held-out share, in rows of 8.
# Validation and checkpoints every 100 steps: at cpu_recipe's 25, they took ~45% of the wall time.
STEPS=${STEPS:-$($PY -c "
from data.packaged import repo_asset_manifest
kept = sum(repo_asset_manifest(name)['counts']['kept'] for name in '$ASSET'.split(','))
print(int(kept * (1 - $VAL) / $ROWS))")}
echo "fine-tune: $ASSET, $STEPS steps of $ROWS rows, lr $LR after $WARMUP warm-up steps ($(date +%T))"
OMP_NUM_THREADS=2 $PY train/run.py run_dir="$OUT/ft" stages=[prepare,train] data=jsonl "data.sources=[$ASSET]" \
  data.max_length=1024 data.val_fraction=$VAL train=cpu_recipe data.regenerate.enabled=false \
  data.max_conversations=null head.init=release target.dtype=auto train.hidden_states=online \
  train.precision=auto train.ttt_steps=4 train.batch_size=$ROWS train.max_steps="$STEPS" train.lr=$LR \
  train.warmup_steps=$WARMUP train.val_every=100 train.checkpoint_every=100 wandb.mode=disabled > "$OUT/ft.log" 2>&1

# The candidate as it would ship (bf16 tensors), kept out of heads/release/ (tests list that folder).
if [ ! -d "$OUT/candidate" ]; then
  $PY docs/study/make_release.py "$OUT/ft/head" candidate-scratch heads/release/smollm2-135m-eagle3/README.md
  mv heads/release/candidate-scratch "$OUT/candidate"
fi
SHIPPED=heads/release/smollm2-135m-eagle3
judge() {  # judge <core> <head> <name>
  [ -f "$OUT/$3_48/report.json" ] || OMP_NUM_THREADS=1 taskset -c "$1" $PY eval/run.py head_dir="$2" \
    out="$OUT/$3_48" "eval.tasks=[$HELDOUT]" eval.prompts_per_task=48 eval.max_new_tokens=96 \
    eval.draft_length=4 eval.policy=static eval.calibration=false eval.baselines=false \
    target.dtype=auto > "$OUT/$3_judge.log" 2>&1
}
echo "judging ($(date +%T))"
judge 0 "$OUT/candidate" candidate &
judge 1 "$SHIPPED" shipped &
wait
$PY - "$OUT" <<'EOF'
import json, statistics, sys
from eval.report import Record
out = sys.argv[1]
for name in ("shipped", "candidate"):
    report = json.load(open(f"{out}/{name}_48/report.json"))
    print(f"{name:9} AL on 48 held-out chat prompts {report['overall']['acceptance_length']:.3f};"
          f" greedy mismatches {report['identity']['plain_mismatches']}")
# The verdict per prompt: the candidate's AL minus the shipped head's, turn by turn.
al = {}
for name in ("shipped", "candidate"):
    for line in open(f"{out}/{name}_48/records.jsonl"):
        r = Record(**json.loads(line))
        al[name, r.id, r.turn] = r.acceptance_length
diffs = [al["candidate", i, t] - v for (name, i, t), v in al.items() if name == "shipped"]
mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
print(f"48 per prompt: candidate - shipped {mean:+.3f} (s.e. {se:.3f}) over {len(diffs)} prompts;"
      f" {sum(d > 0 for d in diffs)} up, {sum(d < 0 for d in diffs)} down, {sum(d == 0 for d in diffs)} level")
EOF
echo "done ($(date +%T))"
