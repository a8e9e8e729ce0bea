# Shared settings of the recipe study (sourced; BENCHMARKS.md "Recipe study"; runs write outputs/study/). REGEN = the regenerated JSONL (bf16 target, greedy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
mkdir -p outputs/study
REGEN=data/assets/smollm2_sharegpt_replies.jsonl.gz  # the shipped replies (the study read the same file from the regeneration cache)
HELDOUT=docs/study/heldout_chat.jsonl
evalhead() {  # evalhead <head dir> <out dir> [overrides]: AL on held-out chat + the three eval sets, T=0, chain K=4
  local head=$1 out=$2; shift 2
  $PY eval/run.py head_dir="$head" out="$out" "eval.tasks=[$HELDOUT,mt_bench,humaneval,gsm8k]" \
    eval.prompts_per_task=12 eval.max_new_tokens=96 eval.draft_length=4 eval.policy=static \
    eval.calibration=false "$@"
}
# The ablations' rows and batches (docs/study/ablations.sh, teacher_forced.sh): the shipped replies
# at <= 1024 tokens with the same 29 held-out conversations, 4 rows per step, fp32, TTT 4.
REPLIES_1024=(data.sources=[$REGEN] data.max_conversations=null data.max_length=1024 data.val_fraction=0.05)
STUDY_TRAIN=(train=recipe train.precision=fp32 train.ttt_steps=4 train.batch_size=4 train.grad_accum=1
  train.val_batches=8 head.confidence=false wandb.mode=disabled)
