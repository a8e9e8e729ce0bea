#!/usr/bin/env bash
# Decoder tokens/s and the trainer's step time, before (a commit) and after (this checkout), in one
# run: the two checkouts alternate, twice each, on the same prompts and settings.
#   bash docs/study/before_after.sh 6f35ee4 > outputs/before_after.txt
set -euo pipefail
BEFORE=${1:?usage: before_after.sh <commit>}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OLD=/tmp/drafter_before_$BEFORE
[ -d "$OLD" ] || git -C "$ROOT" worktree add --detach "$OLD" "$BEFORE" >/dev/null
PY=$ROOT/.venv/bin/python
DECODE='
import sys, time, torch
from heads.target import Target, TargetConfig
from heads.registry import load_head
from data.chat_template import generation_prompt_ids
from eval.decoder import ChainDrafting, SpeculativeDecoder
from eval.policies import StaticDraftLength
torch.manual_seed(0)
target = Target.load(TargetConfig())
head_dir = sys.argv[1]
head = load_head(head_dir, embed_weight=target.embed_weight, lm_head_weight=target.lm_head_weight,
                 target_config=target.config).eval()
prompts = ["Write a short poem about the sea.", "Explain what a hash map is.", "What is 17 times 23? Think step by step."]
ids = [target.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
ids = [list(i["input_ids"]) if hasattr(i, "keys") else list(i) for i in ids]
decoder = SpeculativeDecoder(target.model, head, ChainDrafting(StaticDraftLength(4)), max_len=256,
                             eos_token_id=target.tokenizer.eos_token_id)
decoder.generate(ids[0], 8); decoder.generate_plain(ids[0], 8)
spec = plain = 0.0; spec_tokens = plain_tokens = 0
for p in ids:
    t = time.perf_counter(); out = decoder.generate(p, 64); spec += time.perf_counter() - t; spec_tokens += len(out.tokens)
    t = time.perf_counter(); out = decoder.generate_plain(p, 64); plain += time.perf_counter() - t; plain_tokens += len(out.tokens)
print(f"speculative {spec_tokens / spec:.2f} tok/s, plain {plain_tokens / plain:.2f} tok/s")
'
for round in 1 2; do
  for side in before after; do
    dir=$ROOT; [ $side = before ] && dir=$OLD
    echo "== decode, $side, round $round"
    (cd "$dir" && HF_HUB_OFFLINE=1 $PY -c "$DECODE" "$ROOT/heads/release/smollm2-135m-eagle3" 2>/dev/null | tail -1)
  done
done
for round in 1 2; do
  for side in before after; do
    dir=$ROOT; [ $side = before ] && dir=$OLD
    echo "== train step, $side, round $round"
    (cd "$dir" && HF_HUB_OFFLINE=1 $PY train/bench.py --steps 3 --skip-bf16 --ttt-steps 4 --conversations 20 2>/dev/null | grep -E "^\| (online|offline)" )
  done
done
