# Shared settings of the recipe study (sourced; BENCHMARKS.md "Recipe study"; runs write outputs/study/). REGEN = the regenerated JSONL (bf16 target, greedy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=.venv/bin/python
mkdir -p outputs/study
REGEN=data/assets/smollm2_sharegpt_replies.jsonl.gz  # the shipped replies (the study read the same file from the regeneration cache)
HELDOUT=docs/study/heldout_chat.jsonl
evalhead() {  # evalhead <head dir> <out dir> [extra flags]: AL on held-out chat + the three eval sets, T=0, chain K=4
  local head=$1 out=$2; shift 2
  $PY eval/run.py --head "$head" --out "$out" --tasks "$HELDOUT" mt_bench humaneval gsm8k \
    --prompts-per-task 12 --max-new-tokens 96 --draft-length 4 --policy static \
    --calibration false "$@"
}
