"""Where does first-draft acceptance go between training and decoding? (study script)

Teacher-forced first-draft accuracy of a head (its draft for token t + 2, from the feature of t and
token t + 1, against the target's own choice for token t + 2), by the position inside the reply
(from reply token 1: the decoder's first draft follows the target's first reply token), for
  - replies of the shipped regenerated set the head never trained on (conversations >= --skip),
  - the target's own greedy continuations of held-out chat prompts (what the eval decodes),
with the target in fp32 and in bf16 (the head's features in the dtype it was trained with or not).

    python docs/study/first_draft_gap.py --head heads/release/smollm2-135m-eagle3 --skip 640
"""

import argparse
import gzip
import json

import torch

from data.chat_template import generation_prompt_ids
from data.eval_sets import load_eval_set
from heads.blocks import causal_mask
from heads.registry import load_head
from heads.target import Target, TargetConfig

BUCKETS = ((0, 32), (32, 96), (96, 256), (256, 1024))


def first_draft_hits(target: Target, head, ids: list[int], reply_start: int) -> list[tuple[int, bool]]:
    """(position in the reply, draft == target argmax) for every reply token the head drafts."""
    x = torch.tensor([ids])
    out = target.cached.forward(
        x, torch.arange(len(ids))[None], None, None, None, head.target_layer_ids, num_logits=None
    )
    argmax = out.logits.argmax(-1)[0]  # argmax[t] = the target's choice for token t + 1
    feats = head.project_features([h.float() for h in out.hidden_states], None)
    seq = len(ids) - 1
    mask = causal_mask(torch.ones(1, seq))
    _, logits = head.step(feats[:, :seq], x[:, 1:], torch.arange(seq)[None], None, None, mask)
    drafted = head.draft_token_ids[logits.argmax(-1)[0]]  # drafted[t] predicts token t + 2
    hits = []
    for t in range(reply_start - 1, seq - 1):  # t + 2 = reply tokens 1, 2, ...
        hits.append((t + 2 - reply_start, bool(drafted[t] == argmax[t + 1])))
    return hits


def table(name: str, hits: list[tuple[int, bool]]) -> str:
    cells = []
    for lo, hi in BUCKETS:
        sel = [h for p, h in hits if lo <= p < hi]
        cells.append(f"{100 * sum(sel) / max(len(sel), 1):5.1f}% ({len(sel):5d})")
    total = 100 * sum(h for _, h in hits) / max(len(hits), 1)
    return f"{name:38s} all {total:5.1f}% | " + " | ".join(cells)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--head", required=True)
    p.add_argument("--replies", default="data/assets/smollm2_sharegpt_replies_h200.jsonl.gz")
    p.add_argument("--skip", type=int, default=640)
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=96)
    args = p.parse_args()
    with gzip.open(args.replies, "rt") as f:
        rows = [json.loads(line) for line in f][args.skip : args.skip + args.conversations]
    prompts = load_eval_set("docs/study/heldout_chat.jsonl", args.prompts)
    print("buckets (reply positions):", BUCKETS)
    for dtype in ("float32", "bfloat16"):
        target = Target.load(TargetConfig(dtype=dtype))
        head = load_head(args.head, embed_weight=target.embed_weight.float()).float().eval()
        tok = target.tokenizer
        with torch.no_grad():
            hits = []
            for row in rows:
                prompt = generation_prompt_ids(tok, row["messages"][:1])
                reply = tok.encode(row["messages"][1]["content"], add_special_tokens=False)
                hits += first_draft_hits(target, head, prompt + reply, len(prompt))
            print(table(f"{dtype} target, unseen regenerated", hits))
            hits = []
            for prompt in prompts:
                ids = generation_prompt_ids(tok, [{"role": "user", "content": prompt.turns[0]}])
                out = target.model.generate(
                    torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False
                )[0].tolist()
                hits += first_draft_hits(target, head, out, len(ids))
            print(table(f"{dtype} target, held-out chat continuations", hits))


if __name__ == "__main__":
    main()
